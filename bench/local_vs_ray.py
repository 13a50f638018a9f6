"""The service's own cost: the embedded default in one process (`pcl train --local`) against the same config on Ray
(local Ray, embedded Redis, the same placement: one learner rank, one rollout worker, one verifier), over the same
training budget, several seeds.

    python -m bench.local_vs_ray                    # 3 seeds x 2 arms, 150 s of training each (about 20 minutes)
    python -m bench.local_vs_ray --quick            # 1 seed, 20 s each, 64 held-out prompts: does it work
    python -m bench.local_vs_ray --seeds 0,1,2 --budget 150 --threads 2 --json local_vs_ray.json

Each run is configs/tiny-carry.yaml with learner.num_ranks=1 (the default's 2 ranks are the one difference in
placement --local would map), run.train_budget_s=BUDGET and held-out accuracy at step 0 and when the budget is
spent. Threads: rollout.threads=THREADS in both arms; --local runs every part with it, the fleet's engine runs with
it and its learner and V ranks with one thread each (their fixed setting). Per run: steps per second of training
(steps / train_elapsed_seconds: evaluations and checkpoint writes excluded, both arms), the held-out gain in points,
the wall time from start to summary, and the mean step's split (selection, generation, V's probe, train, weight
sync, and the rest of the step: the loop's own work and, on Ray, its actor calls and Redis round trips outside
those phases). In one process V's step runs after the policy's; on Ray it runs beside it, in its own process.
Printed: per seed, then the means ± sd, the ratio --local / Ray of steps per second (the last line), and of each part
of the step: where the service's time goes. The arms alternate in order from seed to seed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench import add_json_option, run, write_figures

PARTS = ("selection_seconds", "generation_seconds", "probe_seconds", "train_seconds", "weight_sync_seconds")
QUICK = ["data.eval_size=64"]


def one_run(arm: str, seed: int, budget: float, threads: int, run_dir: Path, extra: list[str]) -> dict:
    """One run of the arm ('local' or 'ray'); its figures from metrics.jsonl."""
    from pcl.config import load_config
    from pcl.loop.runlog import read_metrics

    cfg = load_config("configs/tiny-carry.yaml", [
        f"run.seed={seed}", "learner.num_ranks=1", f"rollout.threads={threads}", f"run.train_budget_s={budget}",
        "run.steps=100000", "run.eval_every=100000", "run.time_budget_s=null", "control.port=0",
        "logging.backends=[jsonl]", *extra])
    start = time.perf_counter()
    if arm == "local":
        from entrypoints.local import run_local

        code = run_local(cfg, run_dir=str(run_dir))
    else:
        from entrypoints.train import run_training

        code = run_training(cfg, run_dir=str(run_dir))
    wall = time.perf_counter() - start
    assert code == 0, f"{arm} seed {seed}: exit {code}"
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if "step_seconds" in r]
    evals = [r["eval_accuracy"] for r in records if r.get("eval_accuracy") is not None]
    out = {"steps": len(steps), "train_seconds": steps[-1]["train_elapsed_seconds"], "wall_seconds": wall,
           "steps_per_second": len(steps) / steps[-1]["train_elapsed_seconds"],
           "gain_points": 100 * (evals[-1] - evals[0]), "eval_start": evals[0], "eval_final": evals[-1]}
    for key in ("step_seconds", *PARTS):
        out[key] = statistics.mean(r[key] for r in steps)
    out["rest_seconds"] = out["step_seconds"] - sum(out[key] for key in PARTS)
    return out


def _stat(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="run.seed of each pair of runs (default 0,1,2)")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds of training per run (default 150)")
    parser.add_argument("--threads", type=int, default=2, help="rollout.threads in both arms (default 2)")
    parser.add_argument("--quick", action="store_true", help="one seed, 20 s of training, 64 held-out prompts")
    add_json_option(parser)
    args = parser.parse_args(argv)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    budget, extra = (20.0, QUICK) if args.quick else (args.budget, [])
    runs: dict[str, list[dict]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="pcl-local-vs-ray-") as tmp:
        for i, seed in enumerate(seeds):
            for arm in (("local", "ray") if i % 2 == 0 else ("ray", "local")):
                figures = one_run(arm, seed, budget, args.threads, Path(tmp) / f"{arm}-{seed}", extra)
                runs[arm].append({"seed": seed, **figures})
                print(f"seed {seed} {arm:<5}  {figures['steps']} steps, {figures['steps_per_second']:.3f} steps/s, "
                      f"gain {figures['gain_points']:+.1f} points, wall {figures['wall_seconds']:.0f} s", flush=True)
    return write_figures(args.json, report(runs, budget, args.threads))


def report(runs: dict[str, list[dict]], budget: float, threads: int) -> dict:
    """The means ± sd of each arm, the ratios --local / Ray, printed; returns every figure."""
    summary = {arm: {key: _stat([r[key] for r in rows]) for key in
                     ("steps_per_second", "gain_points", "wall_seconds", "step_seconds", *PARTS, "rest_seconds")}
               for arm, rows in runs.items()}
    local, ray = summary["local"], summary["ray"]
    ratios = {key: local[key][0] / ray[key][0] if ray[key][0] else None for key in
              ("step_seconds", *PARTS, "rest_seconds", "wall_seconds")}
    print(f"{len(runs['local'])} seed(s), {budget:g} s of training each, rollout.threads={threads}")
    for arm in ("local", "ray"):
        s = summary[arm]
        print(f"  {arm:<5}  {s['steps_per_second'][0]:.3f} ± {s['steps_per_second'][1]:.3f} steps/s, gain "
              f"{s['gain_points'][0]:+.1f} ± {s['gain_points'][1]:.1f} points; mean step {s['step_seconds'][0]:.3f} s: "
              + ", ".join(f"{key.removesuffix('_seconds')} {s[key][0]:.3f}" for key in (*PARTS, "rest_seconds")))
    print("  --local / Ray seconds: " + ", ".join(f"{key.removesuffix('_seconds')} x{value:.2f}"
                                                 for key, value in ratios.items() if value is not None))
    speed = local["steps_per_second"][0] / ray["steps_per_second"][0]
    print(f"steps per second, --local / Ray: x{speed:.2f}")
    return {"runs": runs, "summary": summary, "second_ratios": ratios, "steps_per_second_ratio": speed,
            "budget_s": budget, "threads": threads}


if __name__ == "__main__":
    run(main)
