"""`pcl plot RUN_DIR ...` and `pcl summary --plot`: the curves the paper shows, for one run or several overlaid,
in one PNG: held-out accuracy, effective ratio, generation time per step, train reward and V's explained
variance, each against the training step (read from each run's metrics.jsonl; matplotlib, Agg backend).

    plot_runs(["runs/pcl", "runs/uniform"], "docs/results/tiny-demo.png", labels=["PCL", "uniform GRPO"])
"""

from __future__ import annotations

import os
from pathlib import Path

from pcl.loop.record import title
from pcl.loop.runlog import METRICS_FILE, read_records

# step record field -> panel title (the field's own); in the order they are drawn (left to right, top to bottom)
PANELS = {key: title(key) for key in ("eval_accuracy", "effective_ratio", "generation_seconds", "train_reward_mean",
                                      "value_explained_variance")}
SMOOTH = 5  # steps in the moving average drawn over the noisier per-step curves


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
        runs.append((labels[i] if labels else Path(run).resolve().name, read_records(path)))
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, title) in zip(axes.flat, PANELS.items()):
        for i, (label, records) in enumerate(runs):
            colour = colours[i % len(colours)]  # a run keeps its colour in every panel
            points = [(r.step, r.get(key)) for r in records if r.get(key) is not None and r.step is not None]
            if not points:
                continue
            xs, ys = zip(*points)
            if key == "eval_accuracy":
                ax.plot(xs, ys, "o-", color=colour, markersize=3, linewidth=1.4, label=label)
            else:  # per-step values: faint, with their moving average on top
                ax.plot(xs, ys, color=colour, linewidth=0.6, alpha=0.3)
                ax.plot(xs, _smooth(list(ys), SMOOTH), color=colour, linewidth=1.4, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if not ax.lines:
            ax.text(0.5, 0.5, "not recorded by these runs", ha="center", va="center", transform=ax.transAxes)
    legend_ax = axes.flat[-1]
    legend_ax.axis("off")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[i % len(colours)], linewidth=2) for i in range(len(runs))]
    names = [label for label, _ in runs]
    legend_ax.legend(handles, names, loc="center", fontsize=11, title=f"runs (curves: {SMOOTH}-step moving average)")
    fig.tight_layout()
    target = Path(out) if out else Path(run_dirs[0]) / "curves.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target
