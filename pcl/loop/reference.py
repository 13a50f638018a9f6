"""The initial policy's pass rate of every training prompt (the `prefilter` baseline filters on them).

Generated once, before the first step, from n_pre rollouts of each prompt through the `Rollouts` port, in
chunks so the streams never hold the whole set at once; cached in `RUN_DIR/reference_pass_rates.json`
(`pcl.data.reference_rates` has the file's format). A cache already there (the experiment runner writes one)
is read whatever the strategy, so every run reports the reference difficulty of the prompts it selected.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path

from pcl.engines.request import RolloutRequest, SamplingParams
from pcl.loop.ports import Prompts, Rollouts
from pcl.progress import reporter
from pcl.data.reference_rates import REFERENCE_FILE, load_reference, pass_rates, save_reference

REFERENCE_CHUNK = 1024  # prompts per generation call of the reference pass


def reference_pass_rates(rollouts: Rollouts, training_set: Prompts, run_dir: str, policy: str, n_pre: int,
                         policy_version: int, sampling: SamplingParams, timed=None) -> dict[str, float]:
    """Prompt id -> the initial policy's pass rate: from the run directory's cache (any n_pre when `n_pre` is
    0, nothing when there is none), else generated with n_pre rollouts each, sampled as `sampling` says (the run's
    rollout settings), and cached; `timed("reference_seconds")` (a step timer) times the generation."""
    path = Path(run_dir) / REFERENCE_FILE
    if not n_pre and not path.exists():
        return {}
    prompts = training_set.records()
    rates = load_reference(path, policy, prompts, n_pre or None)
    if rates is not None or not n_pre:
        return rates or {}
    if policy_version != 0:
        raise RuntimeError(f"{path}: no reference pass rates for these prompts with n_pre={n_pre}, and "
                           f"the initial policy is gone (policy version {policy_version})")
    rates, started, sampling = {}, time.time(), replace(sampling, n=n_pre)
    with timed("reference_seconds") if timed is not None else contextlib.nullcontext():
        for start in range(0, len(prompts), REFERENCE_CHUNK):
            chunk = RolloutRequest.for_prompts(prompts[start:start + REFERENCE_CHUNK], sampling)
            progress = reporter(run_dir, "reference pass rates", start * n_pre, len(prompts) * n_pre, started)
            rates.update(pass_rates(rollouts.generate_rollouts(0, 0, chunk, tag="reference", on_progress=progress)))
    save_reference(path, policy, prompts, n_pre, rates)
    return rates
