"""Steps per second of asynchronous steps (`run.max_staleness: 1`) against synchronous ones, with the held-out gain
each reaches, and PCL's overhead over uniform GRPO, on the embedded default: `configs/experiments/async-steps.yaml`
(PCL and uniform GRPO, each synchronous and one step ahead on the same placement; both as configs/tiny-carry.yaml
ships them, and shipped PCL with V's step after the policy's; 3 seeds, the same training budget).

    python -m bench.async_steps                     # runs the experiment (~45 min on 2 cores), then the figures
    python -m bench.async_steps --budget 30 --seeds 0   # a quick look
    python -m bench.async_steps --report-only       # the figures of the runs already there
    python -m bench.async_steps --budget 150 --arms pcl-sync pcl-async pcl-shipped --runs-dir runs/experiments/async-150 \
        --output docs/results/async-steps-150s.md

Each run is a normal `pcl train` run of `pcl experiment` (its report, docs/results/async-steps.md, holds the
accuracy table and plots). Steps per second are steps over seconds of training (`train_elapsed_seconds`: held-out
evaluations excluded) at the run's last step, with the standard error over seeds; the ratios of steps per second
are max_staleness 1 over synchronous on the same placement (PCL, then uniform), and over the shipped synchronous
config.

PCL's overhead (`overhead`) is one number per placement: the median over steps 3 on (every seed's steps, pooled) of
step_seconds - policy_train_seconds for PCL, over the same for uniform GRPO. Everything a step does besides the
policy's own training step is in it: V's scoring, V's training step (where it runs past the policy's), the probe's
rollouts, selection, generation, the weight sync. V's step beside the policy's also slows the policy's step on shared
cores, which that ratio leaves out: the shipped-config line sets the policy's median step with V beside it against
the `pcl-shipped-v-after` arm's (V's step after the policy's, `value.train_beside_policy: false`), next to V's own
median step. Results: docs/performance.md, "Asynchronous steps".
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
# PCL's overhead over uniform GRPO: (PCL arm, uniform arm, where) on the same placement and schedule
OVERHEAD_PAIRS = (("pcl-shipped", "uniform-shipped", "shipped config, synchronous"),
                  ("pcl-sync", "uniform-sync", "1-rank learner, synchronous"),
                  ("pcl-async", "uniform-async", "1-rank learner, one step ahead"))
V_AFTER = ("pcl-shipped", "pcl-shipped-v-after")  # the shipped config with V's step beside the policy's, and after it
OVERHEAD_GOAL = 1.05  # on the shipped config
FIRST_TIMED_STEP = 3  # steps 1 and 2 carry the start-up: the reference pass, first calls, the first weight sync


def read_steps(run_dir: Path) -> list[dict]:
    """The training steps' lines of a run's metrics.jsonl (none when it has no such file)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("effective_ratio") is not None]


def timed(steps: list[dict]) -> list[dict]:
    """The steps whose durations are compared: from step 3 on (none in a run of fewer steps: the first steps of a
    run one step ahead also generate their own batch on the spot, so they are not steps like the others)."""
    return [r for r in steps if r["step"] >= FIRST_TIMED_STEP]


def outside_policy_step(line: dict) -> float:
    """A step's seconds besides the policy's own training step."""
    return line["step_seconds"] - line["policy_train_seconds"]


def overhead(pcl: list[dict], uniform: list[dict]) -> dict | None:
    """PCL's overhead over uniform GRPO from their timed steps' lines: the median of step_seconds -
    policy_train_seconds for PCL over the same for uniform (`ratio`), with its parts; None where a line lacks
    policy_train_seconds (a run recorded before the field existed)."""
    if not pcl or not uniform or any(r.get("policy_train_seconds") is None for r in pcl + uniform):
        return None
    median = lambda lines, key: statistics.median(r[key] for r in lines)  # noqa: E731
    pcl_outside = statistics.median(map(outside_policy_step, pcl))
    uniform_outside = statistics.median(map(outside_policy_step, uniform))
    values = [r["value_train_seconds"] for r in pcl if r.get("value_train_seconds") is not None]
    return {"ratio": pcl_outside / uniform_outside, "pcl_outside": pcl_outside, "uniform_outside": uniform_outside,
            "pcl_step": median(pcl, "step_seconds"), "uniform_step": median(uniform, "step_seconds"),
            "pcl_policy": median(pcl, "policy_train_seconds"), "uniform_policy": median(uniform, "policy_train_seconds"),
            "value_step": statistics.median(values) if values else None, "steps": (len(pcl), len(uniform))}


def outside_parts(lines: list[dict]) -> dict[str, float]:
    """Where a step's time besides the policy's step goes: means over the lines (means add up; `other`, the rest,
    is the loop's own work). A step one version ahead generates in the background: the loop waits only for what
    runs past the policy's step (learner_wait_seconds), the probe's rollouts included."""
    def parts(r: dict) -> dict[str, float]:
        ahead = (r.get("batch_staleness") or 0) > 0
        out = {"selection": r["selection_seconds"],
               "generation": (r.get("learner_wait_seconds") or 0.0) if ahead else r["generation_seconds"],
               "probe": 0.0 if ahead else r["probe_seconds"],
               "V past the policy step": r["train_seconds"] - r["policy_train_seconds"],
               "weight sync": r["weight_sync_seconds"]}
        return out | {"other": outside_policy_step(r) - sum(out.values())}

    rows = [parts(r) for r in lines]
    return {key: statistics.fmean(row[key] for row in rows) for key in rows[0]} if rows else {}


def run_figures(run_dir: Path) -> dict | None:
    """Steps per second of training, the median step and policy step from step 3 on, the mean wait figures; None
    without steps."""
    steps = read_steps(run_dir)
    if not steps or not steps[-1].get("train_elapsed_seconds"):
        return None
    mean = lambda key: statistics.fmean([r[key] for r in steps if r.get(key) is not None] or [math.nan])  # noqa: E731
    later = timed(steps) or steps  # a short run's table row: all its steps
    policy = [r["policy_train_seconds"] for r in later if r.get("policy_train_seconds") is not None]
    return {"steps": len(steps), "steps_per_second": len(steps) / steps[-1]["train_elapsed_seconds"],
            "step_median": statistics.median(r["step_seconds"] for r in later),
            "policy_median": statistics.median(policy) if policy else math.nan,
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


def arm_steps(runs_dir: Path, arms: list[str], seeds: list[int]) -> dict[str, list[dict]]:
    """Each arm's timed steps (from step 3 on), every seed's pooled."""
    return {arm: [r for seed in seeds for r in timed(read_steps(runs_dir / f"{arm}-seed{seed}"))] for arm in arms}


def report(figures: dict[str, dict], steps: dict[str, list[dict]] | None = None) -> dict[str, float]:
    print("| arm | seeds | steps / s | median s/step (step 3 on) | median policy step s | generation s | train s | "
          "learner waits s | fleet waits s | staleness |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arm, f in figures.items():
        sps, se = f["steps_per_second"]
        print(f"| {arm} | {f['seeds']} | {sps:.3f}" + (f" ± {se:.3f}" if se else "") +
              f" | {f['step_median'][0]:.2f} | {f['policy_median'][0]:.2f} | {f['generation'][0]:.2f} | "
              f"{f['train'][0]:.2f} | {f['learner_wait'][0]:.2f} | {f['fleet_wait'][0]:.2f} | "
              f"{f['staleness'][0]:.2f} |")
    ratios = {f"{a} / {b}": figures[a]["steps_per_second"][0] / figures[b]["steps_per_second"][0]
              for a, b in PAIRS if a in figures and b in figures}
    ratios.update(report_overhead(steps or {}))
    speeds = [f"{a} / {b}: x{ratios[f'{a} / {b}']:.2f}" for a, b in PAIRS if f"{a} / {b}" in ratios]
    if speeds:
        print("steps per second, " + "; ".join(speeds))
    return ratios


def _seconds(value: float) -> str:
    return f"{0.0 if abs(value) < 0.005 else value:.2f}"  # no "-0.00" for a sum's rounding error


def report_overhead(steps: dict[str, list[dict]]) -> dict[str, float]:
    """PCL's overhead on each placement both arms ran on, where its time goes, and V's share of the policy's step."""
    ratios: dict[str, float] = {}
    for pcl, uniform, where in OVERHEAD_PAIRS:
        if pcl not in steps or uniform not in steps:
            continue
        if not steps[pcl] or not steps[uniform]:
            print(f"PCL's overhead ({where}): no step {FIRST_TIMED_STEP} or later in the runs of {pcl} or {uniform} "
                  "(a longer --budget)")
            continue
        o = overhead(steps[pcl], steps[uniform])
        if o is None:
            print(f"PCL's overhead ({where}): its runs lack policy_train_seconds (recorded before the field): run "
                  "them again")
            continue
        ratios[f"pcl overhead ({where})"] = o["ratio"]
        goal = (f"; the goal, <= {OVERHEAD_GOAL}: {'met' if o['ratio'] <= OVERHEAD_GOAL else 'NOT met'}"
                if pcl == "pcl-shipped" else "")
        value = "-" if o["value_step"] is None else f"{o['value_step']:.2f} s"
        print(f"PCL's overhead ({where}): x{o['ratio']:.3f}, median step_seconds - policy_train_seconds from step "
              f"{FIRST_TIMED_STEP} on {o['pcl_outside']:.2f} s over uniform's {o['uniform_outside']:.2f} s "
              f"({o['steps'][0]} and {o['steps'][1]} steps; median step {o['pcl_step']:.2f} s against "
              f"{o['uniform_step']:.2f} s, policy step {o['pcl_policy']:.2f} s against {o['uniform_policy']:.2f} s, "
              f"V's step {value}){goal}")
        mine, theirs = outside_parts(steps[pcl]), outside_parts(steps[uniform])
        print("  besides the policy step, mean s (PCL / uniform): " +
              ", ".join(f"{key} {_seconds(mine[key])} / {_seconds(theirs[key])}" for key in mine))
    beside, after = (steps.get(arm) for arm in V_AFTER)
    if beside is not None and after is not None and not (beside and after):
        print(f"V's step beside the policy's: no step {FIRST_TIMED_STEP} or later in the runs of {' or '.join(V_AFTER)}")
    if beside and after and all(r.get("policy_train_seconds") is not None for r in beside + after):
        policy = [statistics.median(r["policy_train_seconds"] for r in lines) for lines in (beside, after)]
        values = [r["value_train_seconds"] for r in beside if r.get("value_train_seconds") is not None]
        ratios["policy step, V beside / V after (shipped)"] = policy[0] / policy[1]
        print(f"V's step beside the policy's (shipped config): the policy's median step {policy[0]:.2f} s, "
              f"{policy[1]:.2f} s with V's step after it ({V_AFTER[1]}): x{policy[0] / policy[1]:.3f}; V's own "
              "median step " + (f"{statistics.median(values):.2f} s" if values else "-"))
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
    arms = list(exp["strategies"])
    figures = arm_table(runs_dir, arms, exp["seeds"])
    ratios = report(figures, arm_steps(runs_dir, arms, exp["seeds"]))
    return write_figures(args.json, {"arms": figures, "ratios": ratios, "budget_s": exp["budget_s"],
                                     "seeds": exp["seeds"]})


if __name__ == "__main__":
    run(main)
