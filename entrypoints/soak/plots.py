"""The soak's resources over time in one PNG (OUT/soak.png): RSS of each process, threads and descriptors of each,
Redis' memory and the history's, the run directory's files, Ray's session and logs, the control plane's answers.
The warm-up is shaded: the report's slopes start after it.

    plot_samples(samples, report, "runs/soak/soak.png")
"""

from __future__ import annotations

from pathlib import Path


def _panel(ax, title: str, lines: dict[str, tuple[list[float], list[float]]], unit: str, warmup_h: float) -> None:
    for label, (xs, ys) in sorted(lines.items()):
        if xs:
            ax.plot(xs, ys, label=label, linewidth=1)
    ax.axvspan(0, warmup_h, color="#eeeeee", zorder=0)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("hours of training", fontsize=8)
    ax.set_ylabel(unit, fontsize=8)
    ax.tick_params(labelsize=7)
    if lines:
        ax.legend(fontsize=5, ncol=2, loc="upper left")


def _lines(samples: list[dict], get, scale: float = 1.0) -> dict[str, tuple[list[float], list[float]]]:
    """{label: (hours, values)} from `get(sample) -> {label: value}`."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for s in samples:
        if s["t"] < 0:
            continue
        for label, value in (get(s) or {}).items():
            if isinstance(value, (int, float)):
                xs, ys = out.setdefault(label, ([], []))
                xs.append(s["t"] / 3600)
                ys.append(value / scale)
    return out


def plot_samples(samples: list[dict], report: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    warm = report.get("warmup_s", 0) / 3600
    fig, axes = plt.subplots(3, 3, figsize=(18, 13))
    mb = 1e6
    _panel(axes[0, 0], "RSS per process", _lines(samples, lambda s: {k: v[0] for k, v in s["procs"].items()}, mb),
           "MB", warm)
    _panel(axes[0, 1], "threads per process", _lines(samples, lambda s: {k: v[1] for k, v in s["procs"].items()}),
           "threads", warm)
    _panel(axes[0, 2], "open descriptors per process",
           _lines(samples, lambda s: {k: v[2] for k, v in s["procs"].items()}), "fds", warm)
    _panel(axes[1, 0], "Redis memory",
           _lines(samples, lambda s: {k: s["redis"][k] for k in ("used_memory", "history_bytes")
                                      if k in s.get("redis", {})}, mb), "MB", warm)
    _panel(axes[1, 1], "stream lengths", _lines(samples, lambda s: s.get("redis", {}).get("streams")), "entries",
           warm)
    _panel(axes[1, 2], "run directory",
           _lines(samples, lambda s: {k: v for k, v in s["files"].items() if not k.endswith("#")}, mb), "MB", warm)
    _panel(axes[2, 0], "Ray session",
           _lines(samples, lambda s: {k: v for k, v in s.get("ray", {}).items() if k in ("session/", "logs/")}, mb),
           "MB", warm)
    _panel(axes[2, 1], "control plane: bytes",
           _lines(samples, lambda s: {k: v[0] for k, v in s.get("control", {}).items()}, 1e3), "kB", warm)
    _panel(axes[2, 2], "control plane: seconds",
           _lines(samples, lambda s: {k: v[1] for k, v in s.get("control", {}).items()}), "s", warm)
    fig.suptitle(f"pcl soak: {report.get('pace', {}).get('steps', 0)} steps; warm-up shaded", fontsize=11)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
