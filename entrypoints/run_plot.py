"""`pcl plot RUN_DIR ...` and `pcl summary --plot`: the curves the paper shows, and whether the curriculum pays, for
one run or several overlaid, in one PNG (matplotlib, Agg backend), read from each run's metrics.jsonl:

- against the training step: held-out accuracy, the effective ratio (realised, uniform selection's on V's probe,
  V's expectation), the curriculum's gain over uniform selection, generation time per step, train reward, V's
  explained variance, V's calibration error (probe and trained prompts) and the selected band's width;
- V's reliability diagram over the run's last window (RUN_DIR/calibration.json, else the last record's table) and
  the pool V scored at the last step, with the band PCL selected (tau +- its width).

A run keeps its colour in every panel; within a panel, a figure its line style.

    plot_runs(["runs/pcl", "runs/uniform"], "docs/results/tiny-demo.png", labels=["PCL", "uniform GRPO"])
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pcl.loop.curriculum_window import CALIBRATION_FILE
from pcl.loop.record import StepRecord, title
from pcl.loop.runlog import METRICS_FILE, read_records

STYLES = ("-", "--", ":")
# panel -> (title, the figures it draws: (field, its name in the panel's legend)), in the order they are drawn
PANELS = {
    "eval_accuracy": (title("eval_accuracy"), [("eval_accuracy", "")]),
    "effective_ratio": ("effective ratio: realised, uniform selection's, V's expectation", [
        ("effective_ratio", "realised"), ("uniform_effective_ratio", "uniform (probe)"),
        ("expected_effective_ratio", "V expected")]),
    "curriculum_gain": (title("curriculum_gain"), [("curriculum_gain", "")]),
    "generation_seconds": (title("generation_seconds"), [("generation_seconds", "")]),
    "train_reward_mean": (title("train_reward_mean"), [("train_reward_mean", "")]),
    "value_explained_variance": (title("value_explained_variance"), [("value_explained_variance", "")]),
    "calibration_error": ("V's calibration error (recent steps)", [
        ("probe_calibration_error", "probe"), ("trained_calibration_error", "trained")]),
    "selected_band_width": (title("selected_band_width"), [("selected_band_width", "")]),
}
SMOOTHED = ("effective_ratio", "expected_effective_ratio", "generation_seconds", "train_reward_mean",
            "selected_band_width")  # per-step figures: faint, under their moving average (the others are pooled)
SMOOTH = 5  # steps in the moving average


def _smooth(ys: list[float], width: int) -> list[float]:
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y - (ys[i - width] if i >= width else 0.0)
        out.append(total / min(i + 1, width))
    return out


def plot_runs(run_dirs: list[str | os.PathLike], out: str | os.PathLike | None = None,
              labels: list[str] | str | None = None) -> Path:
    """Write the PNG (default RUN_DIR/curves.png of the first run) and return its path. A run directory without
    metrics raises FileNotFoundError; matplotlib missing is an ImportError naming the extra."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("pcl plot needs matplotlib: pip install 'pcl-service[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(labels, str):
        labels = labels.split(",")
    if labels and len(labels) != len(run_dirs):
        raise ValueError(f"--labels: {len(labels)} labels for {len(run_dirs)} runs")
    runs = []
    for i, run in enumerate(run_dirs):
        path = Path(run) / METRICS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{run}: no {METRICS_FILE} here")
        runs.append((labels[i] if labels else Path(run).resolve().name, read_records(path), Path(run)))
    fig, axes = plt.subplots(3, 4, figsize=(19, 11))
    colours = [plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10] for i in range(len(runs))]
    for ax, (panel_title, figures) in zip(axes.flat, PANELS.values()):
        for colour, (_, records, _) in zip(colours, runs):
            for (key, _), style in zip(figures, STYLES):
                _curve(ax, records, key, colour, style)
        _finish(ax, panel_title, "step", figures)
    reliability(axes.flat[8], runs, colours)
    pool(axes.flat[9], runs, colours)
    from matplotlib.lines import Line2D

    axes.flat[10].axis("off")
    axes.flat[11].axis("off")
    handles = [Line2D([], [], color=c, linewidth=2) for c in colours]
    axes.flat[10].legend(handles, [label for label, *_ in runs], loc="center", fontsize=11,
                         title=f"runs (per-step curves: {SMOOTH}-step moving average)")
    fig.tight_layout()
    target = Path(out) if out else Path(run_dirs[0]) / "curves.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def _curve(ax, records: list[StepRecord], key: str, colour: str, style: str) -> None:
    points = [(r.step, r.get(key)) for r in records if isinstance(r.get(key), (int, float)) and r.step is not None]
    if not points:
        return
    xs, ys = zip(*points)
    if key == "eval_accuracy":
        ax.plot(xs, ys, "o" + style, color=colour, markersize=3, linewidth=1.4)
    elif key in SMOOTHED:
        ax.plot(xs, ys, style, color=colour, linewidth=0.6, alpha=0.3)
        ax.plot(xs, _smooth(list(ys), SMOOTH), style, color=colour, linewidth=1.4)
    else:
        ax.plot(xs, ys, style, color=colour, linewidth=1.4)


def _finish(ax, panel_title: str, xlabel: str, figures: list[tuple[str, str]]) -> None:
    """A panel's title, axis, grid, the legend of its figures' line styles, or a word where nothing was drawn."""
    from matplotlib.lines import Line2D

    ax.set_title(panel_title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    if not ax.lines and not ax.patches:
        ax.text(0.5, 0.5, "not recorded by these runs", ha="center", va="center", transform=ax.transAxes)
    elif len(figures) > 1:
        ax.legend([Line2D([], [], color="0.3", linestyle=s) for s in STYLES[:len(figures)]],
                  [name for _, name in figures], fontsize=8)


def _last(records: list[StepRecord], key: str) -> StepRecord | None:
    return next((r for r in reversed(records) if isinstance(r.get(key), dict) and r.get(key)), None)


def reliability(ax, runs: list, colours: list[str]) -> None:
    """Mean realised pass rate against mean V by bin of V over each run's last window (the probe solid, the trained
    prompts dashed); y = x is a calibrated V."""
    for colour, (_, records, run_dir) in zip(colours, runs):
        for name, style in zip(("probe", "trained"), STYLES):
            points = _reliability_points(run_dir, records, name)
            if points:
                xs, ys, counts = zip(*points)
                total = sum(counts)
                ax.plot(xs, ys, style, color=colour, linewidth=1.2)
                ax.scatter(xs, ys, s=[8 + 120 * c / total for c in counts], color=colour, alpha=0.6)
    if ax.lines:
        ax.plot([0, 1], [0, 1], color="0.6", linewidth=0.8, linestyle=":")
    ax.set_ylabel("realised pass rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    _finish(ax, "V's reliability (last window; area: prompts)", "V (mean of its bin)",
            [("probe", "random probe"), ("trained", "trained")])


def _reliability_points(run_dir: Path, records: list[StepRecord], name: str) -> list[tuple[float, float, int]]:
    """(mean V, mean realised, prompts) of each filled bin: RUN_DIR/calibration.json, else the last record's."""
    path = run_dir / CALIBRATION_FILE
    if path.is_file():
        rows = json.loads(path.read_text())[name]["all"]
        return [(r["predicted"], r["realized"], r["count"]) for r in rows if r["count"]]
    last = _last(records, f"{name}_reliability_count")
    if last is None:
        return []
    predicted, realized = last.get(f"{name}_reliability_predicted"), last.get(f"{name}_reliability_realized")
    return sorted((predicted[b], realized[b], c) for b, c in last.get(f"{name}_reliability_count").items())


def pool(ax, runs: list, colours: list[str]) -> None:
    """The candidates V scored at each run's last step, by bin of V, and the band it selected from (tau +- width)."""
    for colour, (_, records, _) in zip(colours, runs):
        last = _last(records, "pool_histogram")
        if last is None:
            continue
        bins = sorted((*map(float, label.split("-")), count) for label, count in last.pool_histogram.items())
        edges = [lo for lo, _, _ in bins] + [bins[-1][1]]
        ax.stairs([c for _, _, c in bins], edges, color=colour, linewidth=1.4)
        tau, width = last.get("tau"), last.selected_band_width
        if tau is not None and width is not None:
            ax.axvspan(max(0.0, tau - width), min(1.0, tau + width), color=colour, alpha=0.12)
            ax.axvline(tau, color=colour, linewidth=0.8, linestyle=":")
    ax.set_ylabel("candidates")
    ax.set_xlim(0, 1)
    _finish(ax, "pool V scored at the last step, selected band shaded", "V", [])
