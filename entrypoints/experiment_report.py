"""The report of a strategy comparison (`pcl experiment`): a markdown table and PNG plots from the runs.

    write_report(load_experiment("configs/experiments/tiny-compare.yaml"))

Per arm, over its seeds: best held-out accuracy, time to reach the target accuracy (training seconds from the
start of training: `train_elapsed_seconds`, which leaves out evaluations and checkpoint writes; the wall clock
`elapsed_seconds` for runs recorded before that existed), mean effective ratio, mean generation and selection
seconds per step, steps done. Plots: held-out accuracy against training time, effective ratio, V's explained
variance and the reference difficulty (initial policy's pass rate) of the selected prompts against the step.
Where an arm's strategy uses V, a section on what its curriculum bought over uniform selection
(`entrypoints.experiment_curriculum`).
Numbers come only from the runs' metrics.jsonl files.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

from entrypoints.experiment_curriculum import curriculum_section
from pcl.loop.record import StepRecord, check_keys
from pcl.loop.runlog import METRICS_FILE, read_records

PLOTS = {  # file stem -> (y key, x key, y label, title)
    "accuracy-vs-time": ("eval_accuracy", "training_seconds", "held-out accuracy", "Held-out accuracy vs training time"),
    "effective-ratio": ("effective_ratio", "step", "effective ratio", "Effective ratio vs step"),
    "value-ev": ("value_explained_variance", "step", "explained variance of V", "V's explained variance vs step"),
    "reference-difficulty": ("selected_reference_pass_rate_mean", "step", "reference pass rate of selected prompts",
                             "Reference difficulty of the selected prompts vs step"),
}
check_keys([y for y, *_ in PLOTS.values()], "entrypoints.experiment_report.PLOTS")


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def training_seconds(record: StepRecord | dict) -> float | None:
    """The training time at a record: `train_elapsed_seconds` (evaluations and checkpoint writes left out), the
    wall clock `elapsed_seconds` where a run predates it, 0 at the step-0 evaluation, else None.

    >>> training_seconds({"step": 3, "elapsed_seconds": 9.0, "train_elapsed_seconds": 7.5})
    7.5
    """
    r = StepRecord.coerce(record)
    seconds = r.train_elapsed_seconds if r.train_elapsed_seconds is not None else r.elapsed_seconds
    return 0.0 if seconds is None and r.step == 0 else seconds


def run_figures(records: list[StepRecord | dict], target: float, gain: bool = False) -> dict:
    """One run's headline figures; the target is an accuracy, or (gain) a rise over the run's first evaluation."""
    records = [StepRecord.coerce(r) for r in records]
    steps = [r for r in records if r.effective_ratio is not None]
    evals = [r for r in records if r.eval_accuracy is not None]
    if gain and evals:
        target = evals[0].eval_accuracy + target - 1e-9
    reached = [training_seconds(r) or 0.0 for r in evals if r.eval_accuracy >= target]
    start = evals[0].eval_accuracy if evals else None
    best = max((r.eval_accuracy for r in evals), default=None)
    return {
        "steps": len(steps),
        "accuracy_start": start,
        "accuracy_best": best,
        "gain_best": 100 * (best - start) if evals else None,
        "time_to_target": reached[0] if reached else None,
        "effective_ratio": _mean([r.effective_ratio for r in steps]),
        "generation_seconds": _mean([r.generation_seconds for r in steps]),
        "selection_seconds": _mean([r.selection_seconds for r in steps]),
        "samples_per_step": _mean([r.samples_generated for r in steps]),
        "steps_per_second": len(steps) / seconds if steps and (seconds := training_seconds(steps[-1])) else None,
        "step_seconds_median": _median([r.step_seconds for r in steps[2:]]),  # steps 3 on: the first ones warm up
        "value_explained_variance": _mean([r.value_explained_variance for r in steps[len(steps) // 2:]]),
        "batch_staleness": _mean([r.batch_staleness for r in steps]),
        "learner_wait_seconds": _mean([r.learner_wait_seconds for r in steps]),
        "fleet_wait_seconds": _mean([r.fleet_wait_seconds for r in steps]),
    }


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _se(values: list) -> float | None:
    """The standard error of the mean of `values` (None below two values)."""
    values = [v for v in values if v is not None]
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def arm_figures(runs: list[dict]) -> dict:
    """Mean figures of one arm over its seeds, with the standard error over seeds of the best accuracy, the best
    gain over the run's step-0 accuracy (points; every arm of a seed starts from the same evaluation, so the gain
    pairs the arms seed by seed) and the time to target; time to target over the seeds that reached it.

    >>> f = arm_figures([{"accuracy_best": 0.5, "time_to_target": 10.0}, {"accuracy_best": 0.6, "time_to_target": None}])
    >>> f["accuracy_best"], round(f["accuracy_best_se"], 3), f["time_to_target"], f["time_to_target_se"], f["reached"]
    (0.55, 0.05, 10.0, None, '1/2')
    """
    out = {key: _mean([r[key] for r in runs]) for key in runs[0] if key != "time_to_target"}
    reached = [r["time_to_target"] for r in runs if r["time_to_target"] is not None]
    out["time_to_target"], out["time_to_target_se"] = _mean(reached), _se(reached)
    for key in ("accuracy_best", "gain_best", "steps_per_second"):
        out[f"{key}_se"] = _se([r.get(key) for r in runs])
    out["reached"] = f"{len(reached)}/{len(runs)}"
    return out


def _with_se(value, se, fmt: str) -> str:
    return _cell(value, fmt) + ("" if value is None or se is None else " ± " + format(se, fmt.lstrip("+")))


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(figures: dict[str, dict], target: str) -> str:
    head = ("| strategy | seeds reaching target | best held-out accuracy | best gain (points) | time to " + target +
            " (s) | mean effective ratio | generation s/step | selection s/step | samples generated / step | steps |"
            " steps / s | median s/step (step 3 on) | V's EV (second half) |")
    lines = [head, "|" + "---|" * 13]
    for arm, f in figures.items():
        lines.append(f"| {arm} | {f['reached']} | {_with_se(f['accuracy_best'], f['accuracy_best_se'], '.3f')} | "
                     f"{_with_se(f['gain_best'], f['gain_best_se'], '+.1f')} | "
                     f"{_with_se(f['time_to_target'], f['time_to_target_se'], '.0f')} | "
                     f"{_cell(f['effective_ratio'], '.3f')} | "
                     f"{_cell(f['generation_seconds'], '.2f')} | {_cell(f['selection_seconds'], '.3f')} | "
                     f"{_cell(f['samples_per_step'], '.0f')} | {_cell(f['steps'], '.0f')} | "
                     f"{_with_se(f['steps_per_second'], f['steps_per_second_se'], '.3f')} | "
                     f"{_cell(f['step_seconds_median'], '.2f')} | {_cell(f['value_explained_variance'], '.2f')} |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, list[StepRecord]]], out_dir: Path) -> list[Path]:
    """One PNG per entry of PLOTS; every seed of an arm in the arm's colour. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    written = []
    for stem, (y_key, x_key, y_label, title) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        drawn = False
        for i, (arm, seeds) in enumerate(runs.items()):
            for j, (seed, records) in enumerate(sorted(seeds.items())):
                points = [(training_seconds(r) if x_key == "training_seconds" else r.get(x_key), r.get(y_key))
                          for r in map(StepRecord.coerce, records)]
                points = [(x, y) for x, y in points if x is not None and y is not None]
                if not points:
                    continue
                xs, ys = zip(*points)
                ax.plot(xs, ys, styles[j % len(styles)], color=colours[i % len(colours)], linewidth=1.2,
                        label=f"{arm} (seed {seed})")
                drawn = True
        ax.set_xlabel("seconds of training (evaluations excluded)" if x_key == "training_seconds" else "step")
        ax.set_ylabel(y_label)
        ax.set_title(title)
        if drawn:
            ax.legend(fontsize=7, ncol=2)
        else:
            ax.text(0.5, 0.5, "no run records this figure", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_report(exp) -> Path:
    """Read every run of the experiment, write the markdown report and its plots; returns the report's path."""
    runs = read_runs(exp)
    gain = exp.target_gain is not None
    target, target_name = (exp.target_gain, f"+{exp.target_gain:.2f}") if gain else (exp.target_accuracy,
                                                                                     f"{exp.target_accuracy:.2f}")
    figures = {arm: arm_figures([run_figures(r, target, gain) for r in seeds.values()])
               for arm, seeds in runs.items()}
    out = exp.output_path
    plot_dir = out.parent / out.stem
    plots = plot(runs, plot_dir)
    reference = [json.loads(p.read_text()) for p in sorted(exp.runs_path.glob("reference-seed*.json"))]
    lines = _introduction(exp, table(figures, target_name), target, gain)
    if reference:
        r = reference[0]
        lines += ["", f"Reference pass rates (initial policy, {r['n_pre']} rollouts of each of {r['prompts']} training "
                  f"prompts, one process) took {statistics.fmean(x['seconds'] for x in reference):.0f} s per seed, "
                  "once, outside every run's budget; the prefilter arm filters on them, every arm reports the "
                  "reference difficulty of what it selected."]
    failed = sorted(p.parent.name for p in exp.runs_path.glob("*/FAILED"))
    if failed:
        lines += ["", f"Failed runs (their records so far are included): {', '.join(failed)}."]
    lines += ["", "## Plots", ""]
    lines += [f"![{p.stem}]({plot_dir.name}/{p.name})" for p in plots]
    lines += curriculum_section(runs, plot_dir)  # only where a run's records carry the curriculum's figures
    lines += _per_run(runs, target, gain)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


def read_runs(exp) -> dict[str, dict[int, list[StepRecord]]]:
    """The step records of every run of the experiment that has any: arm -> seed -> records."""
    runs: dict[str, dict[int, list[StepRecord]]] = {}
    for arm in exp.strategies:
        for seed in exp.seeds:
            path = exp.runs_path / f"{arm}-seed{seed}" / METRICS_FILE
            if path.is_file():
                runs.setdefault(arm, {})[seed] = read_records(path)
    if not runs:
        raise FileNotFoundError(f"no run of experiment {exp.name!r} under {exp.runs_path}")
    return runs


def _introduction(exp, figures_table: str, target: float, gain: bool) -> list[str]:
    """The report's title, how its runs were made, the arms, the table of figures and how to read it."""
    return [
        f"# Strategy comparison: {exp.name}",
        "",
        f"Written by `pcl experiment` on {time.strftime('%Y-%m-%d %H:%M')} ({platform.machine()}, "
        f"{os.cpu_count()} CPU cores). Base config `{exp.base}` with "
        f"{', '.join(f'`{o}`' for o in exp.overrides) or 'no overrides'}; "
        f"every arm with seeds {exp.seeds}, one after another, each with a training budget of "
        f"{exp.budget_s:g} s on the paper's clock (`run.train_budget_s`: held-out evaluations, checkpoint "
        "writes and actor start-up excluded).",
        "",
        "Arms: " + "; ".join(f"**{arm}** " + " ".join(f"`{o}`" for o in arm_overrides)
                             for arm, arm_overrides in exp.strategies.items()) + ".",
        "",
        figures_table,
        "",
        "Best held-out accuracy, effective ratio and seconds per step are means over the seeds (± the standard "
        "error over seeds); time to target ("
        + (f"the run's step-0 held-out accuracy + {target:.2f}" if gain else f"held-out accuracy {target:.2f}")
        + ") is the mean over the seeds that reached it, in seconds of training (evaluations and checkpoint writes "
        "excluded). Generation seconds include every generation round of a step (screening and refills), not the "
        "rollouts of V's explained-variance probe (PCL only, counted apart as probe_seconds); selection seconds are "
        "drawing candidates, V's scoring and the strategy's own work.",
    ]


def _per_run(runs: dict[str, dict[int, list[StepRecord]]], target: float, gain: bool) -> list[str]:
    """The per-run section: each run's steps, start and best accuracy, time to target."""
    lines = ["", "## Per run", "", "| run | steps | start accuracy | best accuracy | time to target (s) |",
             "|---|---|---|---|---|"]
    for arm, seeds in runs.items():
        for seed, records in sorted(seeds.items()):
            f = run_figures(records, target, gain)
            lines.append(f"| {arm} seed {seed} | {f['steps']} | {_cell(f['accuracy_start'], '.3f')} | "
                         f"{_cell(f['accuracy_best'], '.3f')} | {_cell(f['time_to_target'], '.0f')} |")
    return lines
