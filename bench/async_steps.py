"""Steps per second of asynchronous steps (`run.max_staleness: 1`) against synchronous ones, with the held-out gain
each reaches, on the embedded default: `configs/experiments/async-steps.yaml` (PCL and uniform GRPO, each
synchronous and one step ahead on the same placement, and PCL as configs/tiny-carry.yaml ships it; 3 seeds, the same
training budget).

    python -m bench.async_steps                     # runs the experiment (~40 min on 2 cores), then the figures
    python -m bench.async_steps --budget 30 --seeds 0   # a quick look
    python -m bench.async_steps --report-only       # the figures of the runs already there
    python -m bench.async_steps --budget 150 --arms pcl-sync pcl-async pcl-shipped --runs-dir runs/experiments/async-150 \
        --output docs/results/async-steps-150s.md

Each run is a normal `pcl train` run of `pcl experiment` (its report, docs/results/async-steps.md, holds the
accuracy table and plots). Steps per second are steps over seconds of training (`train_elapsed_seconds`: held-out
evaluations excluded) at the run's last step, with the standard error over seeds. The last line is the ratio of
steps per second, max_staleness 1 over synchronous on the same placement (PCL, then uniform), and over the shipped
synchronous config. Results: docs/performance.md, "Asynchronous steps".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench import ROOT, add_json_option, run, write_figures

EXPERIMENT = ROOT / "configs" / "experiments" / "async-steps.yaml"
PAIRS = (("pcl-async", "pcl-sync"), ("uniform-async", "uniform-sync"), ("pcl-async", "pcl-shipped"))


def run_figures(run_dir: Path) -> dict | None:
    """Steps per second of training, the median step from step 3 on, the mean wait figures; None without steps."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    steps = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("effective_ratio") is not None]
    if not steps or not steps[-1].get("train_elapsed_seconds"):
        return None
    mean = lambda key: statistics.fmean([r[key] for r in steps if r.get(key) is not None] or [math.nan])  # noqa: E731
    return {"steps": len(steps), "steps_per_second": len(steps) / steps[-1]["train_elapsed_seconds"],
            "step_median": statistics.median(r["step_seconds"] for r in steps[2:] or steps),
            "outside_train_median": statistics.median(r["step_seconds"] - r["train_seconds"] for r in steps[2:] or steps),
            "train_median": statistics.median(r["train_seconds"] for r in steps[2:] or steps),
            "generation": mean("generation_seconds"), "train": mean("train_seconds"),
            "learner_wait": mean("learner_wait_seconds"), "fleet_wait": mean("fleet_wait_seconds"),
            "staleness": mean("batch_staleness"), "importance_ratio_max": mean("importance_ratio_max")}


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    values = [v for v in values if not math.isnan(v)]  # a figure the run did not record (waits, when synchronous)
    if not values:
        return math.nan, None
    return statistics.fmean(values), (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def arm_table(runs_dir: Path, arms: list[str], seeds: list[int]) -> dict[str, dict]:
    figures = {}
    for arm in arms:
        per_seed = [f for seed in seeds if (f := run_figures(runs_dir / f"{arm}-seed{seed}")) is not None]
        if per_seed:
            keys = per_seed[0].keys()
            figures[arm] = {key: _mean_se([f[key] for f in per_seed]) for key in keys} | {"seeds": len(per_seed)}
    return figures


def report(figures: dict[str, dict]) -> dict[str, float]:
    print("| arm | seeds | steps / s | median s/step (step 3 on) | generation s | train s | learner waits s | "
          "fleet waits s | staleness |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, f in figures.items():
        sps, se = f["steps_per_second"]
        print(f"| {arm} | {f['seeds']} | {sps:.3f}" + (f" ± {se:.3f}" if se else "") +
              f" | {f['step_median'][0]:.2f} | {f['generation'][0]:.2f} | {f['train'][0]:.2f} | "
              f"{f['learner_wait'][0]:.2f} | {f['fleet_wait'][0]:.2f} | {f['staleness'][0]:.2f} |")
    ratios = {f"{a} / {b}": figures[a]["steps_per_second"][0] / figures[b]["steps_per_second"][0]
              for a, b in PAIRS if a in figures and b in figures}
    pcl, uniform = figures.get("pcl-shipped"), figures.get("uniform-shipped")
    if pcl and uniform:  # PCL's own overhead: its step with uniform's policy step in place of its own
        step = pcl["step_median"][0] / uniform["step_median"][0]
        overhead = (pcl["outside_train_median"][0] + uniform["train_median"][0]) / uniform["step_median"][0]
        ratios.update({"pcl step / uniform step (shipped)": step, "pcl overhead / uniform step (shipped)": overhead})
        print(f"median step from step 3 on (shipped config): PCL {pcl['step_median'][0]:.2f} s, uniform "
              f"{uniform['step_median'][0]:.2f} s: x{step:.3f}; with uniform's policy step in place of PCL's "
              f"(the learner's extra work left out): x{overhead:.3f}")
    print("steps per second, " + "; ".join(f"{a} / {b}: x{ratios[f'{a} / {b}']:.2f}" for a, b in PAIRS
                                           if f"{a} / {b}" in ratios))
    return ratios


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.async_steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=None, help="seconds of training per run (default: the "
                        "experiment's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default: the experiment's)")
    parser.add_argument("--arms", nargs="+", default=None, help="arms to run (default: all of the experiment's)")
    parser.add_argument("--runs-dir", default=None, help="where the runs go (default: the experiment's)")
    parser.add_argument("--output", default=None, help="the experiment's report (default: the experiment's, "
                        "docs/results/async-steps.md)")
    parser.add_argument("--report-only", action="store_true", help="read the runs there, train nothing")
    add_json_option(parser)
    args = parser.parse_args(argv)
    exp = yaml.safe_load(EXPERIMENT.read_text())
    exp["budget_s"] = args.budget or exp["budget_s"]
    exp["seeds"] = args.seeds or exp["seeds"]
    if args.arms:
        unknown = sorted(set(args.arms) - set(exp["strategies"]))
        if unknown:
            parser.error(f"--arms: no arm {', '.join(unknown)} in {EXPERIMENT.name} "
                         f"(it has {', '.join(exp['strategies'])})")
        exp["strategies"] = {arm: exp["strategies"][arm] for arm in args.arms}
    if args.runs_dir:
        exp["runs_dir"] = args.runs_dir
    if args.output:
        exp["output"] = args.output
    runs_dir = Path(exp.get("runs_dir") or f"runs/experiments/{exp['name']}")
    if not args.report_only:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(exp, f, sort_keys=False)
        code = subprocess.call([sys.executable, "-m", "entrypoints.cli", "experiment", f.name], cwd=ROOT)
        Path(f.name).unlink()
        if code:
            print(f"bench.async_steps: pcl experiment exited {code}; the figures of the runs that finished follow")
    figures = arm_table(runs_dir, list(exp["strategies"]), exp["seeds"])
    ratios = report(figures)
    return write_figures(args.json, {"arms": figures, "ratios": ratios, "budget_s": exp["budget_s"],
                                     "seeds": exp["seeds"]})


if __name__ == "__main__":
    run(main)
