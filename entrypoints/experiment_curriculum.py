"""The experiment report's "Curriculum" section: what the selection bought over uniform selection, per arm.

    lines = curriculum_section(runs, plot_dir)   # [] when no run's records carry the curriculum's figures

Written only for experiments with an arm whose strategy uses V (PCL): its step records carry the curriculum's
figures (`pcl.loop.curriculum_window`): the uniform counterfactual (the effective ratio realised on V's random
probe), the gain over it, V's expected effective ratio and the expectation gap, V's calibration error on its probe
and on the trained prompts, the selected band's width and the steps stalled. Per arm, means over the second half
of each run's training steps (V has had time to learn), then over the arm's seeds; an arm without V (uniform)
shows its realised effective ratio alone: the counterfactual measured on its own policy. One plot: the realised
effective ratio, the counterfactual and V's expectation, each pooled over the curriculum's window, against
training time, one panel per arm.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pcl.loop.record import StepRecord, check_keys

COLUMNS = {  # key -> (column heading, format); the mean over the second half of the steps unless said
    "effective_ratio": ("realised effective ratio", ".3f"),
    "uniform_effective_ratio": ("uniform counterfactual (probe)", ".3f"),
    "expected_effective_ratio": ("V's expected ratio", ".3f"),
    "curriculum_gain": ("gain over uniform", "+.3f"),
    "expectation_gap": ("expectation gap (expected - realised)", "+.3f"),
    "probe_calibration_error": ("V's calibration error, probe", ".3f"),
    "trained_calibration_error": ("V's calibration error, trained", ".3f"),
    "probe_brier": ("V's Brier, probe", ".3f"),
    "trained_brier": ("V's Brier, trained", ".3f"),
    "selected_band_width": ("selected band width", ".3f"),
}
STALLED = "stalled_share"  # the share of all the run's steps with curriculum_stalled > 0
MARKER = "curriculum_gain"  # a run whose records carry it has the curriculum's figures
check_keys([*COLUMNS, MARKER, "curriculum_stalled"], "entrypoints.experiment_curriculum")
PLOT = "curriculum-ratios"


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def training_steps(records: list[StepRecord | dict]) -> list[StepRecord]:
    """The run's training-step records, in order (the step-0 evaluation left out)."""
    return [r for r in map(StepRecord.coerce, records) if r.effective_ratio is not None]


def has_curriculum(records: list[StepRecord | dict]) -> bool:
    """Whether any of the run's records carries the curriculum's figures."""
    return any(r.get(MARKER) is not None for r in map(StepRecord.coerce, records))


def run_curriculum(records: list[StepRecord | dict]) -> dict[str, float | None]:
    """One run's curriculum figures: each COLUMNS key's mean over the second half of its training steps (None
    where none carries it), and the share of its steps stalled (None for a run without the curriculum's figures).

    >>> f = run_curriculum([{"step": 1, "effective_ratio": 0.2, "step_seconds": 1, "curriculum_gain": 0.0},
    ...                     {"step": 2, "effective_ratio": 0.4, "step_seconds": 1, "curriculum_gain": 0.1,
    ...                      "curriculum_stalled": 1}])
    >>> f["effective_ratio"], f["curriculum_gain"], f["stalled_share"], f["uniform_effective_ratio"]
    (0.4, 0.1, 0.5, None)
    """
    steps = training_steps(records)
    half = steps[len(steps) // 2:]
    out = {key: _mean(r.get(key) for r in half) for key in COLUMNS}
    out[STALLED] = (sum(bool(r.get("curriculum_stalled")) for r in steps) / len(steps)
                    if steps and has_curriculum(steps) else None)
    return out


def arm_curriculum(runs: list[dict[str, float | None]]) -> dict[str, float | None]:
    """An arm's figures: each run figure's mean over the seeds that have it."""
    return {key: _mean(r[key] for r in runs) for key in runs[0]}


def table(figures: dict[str, dict[str, float | None]]) -> str:
    heads = [head for head, _ in COLUMNS.values()] + ["steps stalled"]
    lines = ["| strategy | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 1)]
    for arm, f in figures.items():
        cells = ["-" if f[key] is None else format(f[key], fmt) for key, (_, fmt) in COLUMNS.items()]
        cells.append("-" if f[STALLED] is None else f"{100 * f[STALLED]:.0f}%")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curriculum_section(runs: dict[str, dict[int, list[StepRecord]]], plot_dir: Path) -> list[str]:
    """The report's curriculum section and its plot (in plot_dir); [] when no run carries the figures."""
    if not any(has_curriculum(records) for seeds in runs.values() for records in seeds.values()):
        return []
    figures = {arm: arm_curriculum([run_curriculum(r) for r in seeds.values()]) for arm, seeds in runs.items()}
    path = plot(runs, plot_dir)
    return [
        "", "## Curriculum: what the selection buys over uniform selection", "",
        table(figures), "",
        "Means over the second half of each run's training steps, then over the seeds. The realised effective ratio "
        "is the share of a step's samples with a non-zero advantage. The uniform counterfactual is the effective "
        "ratio realised on V's random probe (a uniform sample of the candidates, rolled out like the batch), pooled "
        "over the last curriculum.window steps: what uniform selection would have trained on with the same policy; "
        "the gain is the realised ratio over the same window minus it. V's expected ratio is the mean of "
        "1 - V^n - (1 - V)^n over the selected prompts; the expectation gap is expected minus realised (positive: "
        "V promised more mixed groups than it delivered). Calibration error is the expected calibration error of "
        "V's predicted pass rates, on the probe and on the trained prompts; the selected band width is the largest "
        "|V - tau| PCL took. Steps stalled: the share of all the run's steps with the gain below curriculum.min_gain "
        "for curriculum.patience steps or more. An arm without V (uniform) has its realised ratio only: the "
        "counterfactual measured on its own policy.",
        "", f"![{path.stem}]({plot_dir.name}/{path.name})",
    ]


def plot(runs: dict[str, dict[int, list[StepRecord]]], out_dir: Path) -> Path:
    """One panel per arm: the realised effective ratio, the uniform counterfactual and V's expected ratio against
    training time (`train_elapsed_seconds`: every run with the curriculum's figures records it), each seed a line
    style, pooled over the curriculum's window (`_ratios`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    series = {"realised": "tab:blue", "uniform counterfactual": "tab:orange", "V's expectation": "tab:green"}
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 3.8), sharey=True, squeeze=False)
    for ax, (arm, seeds) in zip(axes[0], runs.items()):
        for j, (seed, records) in enumerate(sorted(seeds.items())):
            steps = training_steps(records)
            for name, ys in _ratios(steps).items():
                points = [(r.train_elapsed_seconds, y) for r, y in zip(steps, ys)
                          if r.train_elapsed_seconds is not None and y is not None]
                if points:
                    ax.plot(*zip(*points), styles[j % len(styles)], color=series[name], linewidth=1.1, marker="o",
                            markersize=2.5, label=name if j == 0 else None)  # a marker: one step is a point
        ax.set_title(f"{arm} (seeds " + ", ".join(f"{seed} {styles[j % len(styles)]}"
                                                  for j, seed in enumerate(sorted(seeds))) + ")", fontsize=9)
        ax.set_xlabel("seconds of training")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("effective ratio")
    fig.suptitle("Realised effective ratio vs the uniform counterfactual vs V's expectation")
    fig.tight_layout()
    path = out_dir / f"{PLOT}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ratios(steps: list[StepRecord]) -> dict[str, list[float | None]]:
    """The three plotted series of a run's training steps, each over the curriculum's window where the records
    allow: the realised ratio is the counterfactual plus the gain (the step's own ratio where there is no gain),
    V's expectation the windowed realised ratio plus the expectation gap (the step's own where there is no gap)."""
    realised = [r.uniform_effective_ratio + r.curriculum_gain
                if r.curriculum_gain is not None and r.uniform_effective_ratio is not None else r.effective_ratio
                for r in steps]
    expected = [x + r.expectation_gap if r.expectation_gap is not None and r.curriculum_gain is not None
                else r.expected_effective_ratio for x, r in zip(realised, steps)]
    return {"realised": realised, "uniform counterfactual": [r.uniform_effective_ratio for r in steps],
            "V's expectation": expected}
