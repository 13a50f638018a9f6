"""`pcl train PRESET --rehearse`: the preset's whole layout for 2 steps on CPU, before anyone waits for GPUs.

    code = rehearse(preset_cfg)              # prints what it swapped, runs, ends with "PASS" or "FAIL: why"

The config is `pcl.tools.rehearse.rehearsal_config` (the preset's rollout workers and tensor-parallel groups,
learner and V ranks, weight-sync route and queue settings; the tiny model, data and lengths; no GPUs). Before it
runs, the preset itself must pass `pcl plan` against its `cluster` section (a layout its cluster cannot hold
fails here); the run then places every role in its placement group on the local Ray (CPU bundles) and trains
2 steps with the preset's engine (vLLM's CPU build for vLLM). Any refusal or error is a FAIL naming it. With
`--local` the same config runs in this process (`entrypoints.local`), its ranks and workers mapped to one.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

TINY_CONFIG = "configs/tiny.yaml"


def rehearse(preset, tiny=None, run_dir: str | None = None, out=None, local: bool = False) -> int:
    """Rehearse the preset (`pcl.config.Config`) with the tiny config `tiny` (configs/tiny.yaml when None);
    returns 0 on PASS, 1 on FAIL. `local`: in this process (`pcl train PRESET --rehearse --local`), the layout
    mapped to one process as `--local` maps it; the preset's cluster, checked by the plan first, is one machine's."""
    from pcl.config import load_config
    from pcl.loop.runlog import read_metrics
    from pcl.tools.plan import plan_refusal
    from pcl.tools.rehearse import REHEARSAL_STEPS, rehearsal_config

    out = out or sys.stdout
    say = lambda line: print(f"pcl rehearse: {line}", file=out, flush=True)  # noqa: E731
    problem = plan_refusal(preset)
    if problem is not None:
        say(problem)
        say("FAIL: the preset does not fit its cluster (pcl plan's shortfalls above)")
        return 1
    started = time.perf_counter()
    try:
        cfg, swapped = rehearsal_config(preset, tiny or load_config(TINY_CONFIG))
    except ValueError as exc:  # a setting that does not hold together on the rehearsal's shape
        say(f"FAIL: {str(exc).strip().splitlines()[0]}")
        return 1
    say(f"{preset.run.name}: {len(swapped)} settings swapped for a CPU rehearsal of {REHEARSAL_STEPS} steps")
    for line in swapped:
        say(f"  {line}")
    from entrypoints.local import run_local
    from entrypoints.train import run_training

    if local:
        cfg = cfg.model_copy(update={"cluster": type(cfg.cluster)()})
    where = Path(run_dir or tempfile.mkdtemp(prefix="pcl-rehearse-")) / cfg.run.name
    try:
        code = (run_local if local else run_training)(cfg, run_dir=str(where))
        steps = [r["step"] for r in read_metrics(where / "metrics.jsonl") if r.get("step", 0) > 0]
    except Exception as exc:  # noqa: BLE001 - any failure is the rehearsal's verdict
        say(f"{type(exc).__name__}: {exc}")
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        say(f"FAIL after {time.perf_counter() - started:.0f}s: {type(exc).__name__}: {first}")
        return 1
    if code != 0 or len(steps) < REHEARSAL_STEPS:
        say(f"FAIL: the run ended with code {code} after {len(steps)} of {REHEARSAL_STEPS} steps ({where})")
        return 1
    say(f"PASS: {preset.run.name}'s layout trained {len(steps)} steps on CPU in {time.perf_counter() - started:.0f}s "
        f"({where})")
    return 0
