"""Ray's logs in a soak's report (`pcl soak`), judged by what bounds them: rotation. Pure: from the samples' `ray`
part (entrypoints/soak/sampler.py: `logs/` and `session/` totals, each file under logs/ by its path) and the
rotation settings the run's Ray started with (`Facts.ray_rotation_bytes`, `Facts.ray_rotation_backups`, filled by
entrypoints/soak/bounds.py from actors/runtime.py RAY_LIMITS and the environment).

Ray rotates each log file at RAY_ROTATION_MAX_BYTES and keeps RAY_ROTATION_BACKUP_COUNT old ones, so logs/ rightly
grows for hours, until each file reaches the rotation size: "no higher late than early" cannot tell that from a
leak on a soak shorter than that. What rotation bounds, and what is judged here:
- the number of logs (a file and its rotated backups are one log; a file Ray's log monitor moved to logs/old/ when
  its worker died is still one): no more late in the window than early. A log a step (a worker started again and
  again) is the growth rotation does not bound;
- no file over the rotation size (a little slack for the write in progress), no log with more backups than kept;
- the bound itself, logs x (backups + 1) x the rotation size, printed with the growth per hour as information.

    row = logs_row(window, facts.ray_rotation_bytes, facts.ray_rotation_backups)
    row["verdict"]  # "bounded", "grows", "over bound", "unresolved" (rotation unknown), "missing" (no logs seen)
"""

from __future__ import annotations

import re

from pcl.tools.soak_fit import fit_slope

WRITE_SLACK = 1 << 20  # a file may pass the rotation size by a write in progress
# Backups as Ray names them: Python's RotatingFileHandler appends the index (monitor.log.1), spdlog (the C++
# processes' logs and the workers' .out/.err) puts it before the extension (gcs_server.1.out).
_PY_BACKUP = re.compile(r"^(?P<log>.+)\.(?P<index>[1-9]\d*)$")
_CPP_BACKUP = re.compile(r"^(?P<stem>.+)\.(?P<index>[1-9]\d*)(?P<ext>\.[A-Za-z][A-Za-z0-9_]*)$")


def log_of(path: str) -> tuple[str, int]:
    """(the log, the backup's index; 0: the live file) of a file under logs/ (its folder dropped: old/ holds the
    logs of dead workers, moved by Ray's log monitor)."""
    name = path.rsplit("/", 1)[-1]
    match = _CPP_BACKUP.match(name)
    if match:
        return match["stem"] + match["ext"], int(match["index"])
    match = _PY_BACKUP.match(name)
    if match:
        return match["log"], int(match["index"])
    return name, 0


def log_census(ray: dict) -> tuple[int, int, int, str]:
    """(logs, the most backups of one log, the largest file's bytes, its path) of one sample's `ray` part."""
    logs: dict[str, list[int]] = {}
    largest, largest_path = 0, ""
    for key, value in ray.items():
        if not key.startswith("logs/") or key == "logs/" or not isinstance(value, (int, float)):
            continue
        path = key[len("logs/"):]
        log, index = log_of(path)
        logs.setdefault(log, []).append(index)
        if value > largest:
            largest, largest_path = int(value), path
    backups = max((max(max(indices), len(indices) - 1) for indices in logs.values()), default=0)
    return len(logs), backups, largest, largest_path


def logs_row(window: list[dict], max_bytes: int | None, backups: int | None) -> dict:
    """The logs/ row: the number of logs early and late, the largest file and the most backups against the
    rotation, the bound in bytes and the growth per hour (information), and the verdict."""
    seen = [s for s in window if s.get("ray", {}).get("logs/") is not None]
    census = [log_census(s["ray"]) for s in seen]
    if len(seen) < 3 or not any(count for count, *_ in census):
        return {"kind": "logs", "samples": len(seen), "verdict": "missing",
                "note": "no Ray log files in the samples (no session directory found, or its logs/ empty): "
                        "nothing judged"}
    counts = [c[0] for c in census]
    half = len(counts) // 2
    early, late = max(counts[:half]), max(counts[half:])
    largest = max(census, key=lambda c: c[2])
    ys = [float(s["ray"]["logs/"]) for s in seen]
    ts = [s["t"] / 3600 for s in seen]
    row = {"kind": "logs", "start": ys[0], "end": ys[-1], "max": max(ys), "samples": len(seen),
           "logs_early_max": early, "logs_late_max": late, "logs": max(counts),
           "largest_file": largest[2], "largest_path": largest[3], "most_backups": max(c[1] for c in census),
           "rotation_bytes": max_bytes, "rotation_backups": backups,
           "per_hour": list(fit_slope(ts, ys).projected(1.0)) if len(set(ts)) >= 3 else None}
    if max_bytes is None or backups is None:
        row.update(verdict="unresolved", note="the rotation settings are unknown")
    elif late > early:
        row.update(verdict="grows", note=f"the number of logs climbs: {early} early, {late} late")
    elif row["largest_file"] > max_bytes + WRITE_SLACK or row["most_backups"] > backups:
        row.update(verdict="over bound", note=f"{largest[3]}: {largest[2]:,} bytes, {row['most_backups']} backups; "
                                              f"rotation: {max_bytes:,} bytes, {backups} backups")
    else:
        row["verdict"] = "bounded"
    if max_bytes is not None and backups is not None:
        row["bound_bytes"] = row["logs"] * (backups + 1) * max_bytes
    return row


def file_in_rotation(ys: list[float], max_bytes: int | None) -> str:
    """A single log file's verdict: under the rotation size (and the write in progress), or over it."""
    if max_bytes is None:
        return "unresolved"
    return "bounded" if max(ys) <= max_bytes + WRITE_SLACK else "over bound"
