"""The report of a soak (`pcl soak`): from samples taken every few seconds over a long run, what grows, by how much
per hour and per 1,000 steps (each with its 95% interval), projected to a 72-hour run at the presets' pace (about
300 steps in 2-3 days) and at this run's, and whether each is within its goal. Pure: built from the samples
(entrypoints/soak/sampler.py writes them) and a few facts of the config and the code (`Facts`, filled by
entrypoints/soak/bounds.py).

    report = build_report(samples, facts, run={"ended": "finished", ...})
    print(format_report(report)); report["passed"]

The goals (GOALS below; docs/operations.md, "Long runs"):
- every process's RSS, threads and open descriptors flat after warm-up: projected over 72 hours, per hour (this
  run's pace) and per step at the presets' pace, under 50 MB, 5 threads, 20 descriptors. The embedded Redis'
  RSS follows its data and is judged by Redis' own memory instead;
- Redis' memory other than the control history flat (the same 50 MB); the history grows one record a step to its
  cap (HISTORY_MAXLEN) and no further: its bytes per record, when the cap is reached and at what size, and that
  size under half of Redis' maxmemory; every work stream's length under two steps' entries (2 m n: a commit trims
  it) and the event log under its cap; each named client's connections no more late in the run than early;
- files: only the per-step records grow with steps (metrics, selections, tracker events, the driver's output, and
  the checkpoints' copies of metrics and selections), at a stated number of bytes per step; everything else
  bounded (the number of checkpoints by checkpoint.keep, the AOF by its rewrite), judged no higher late in the run
  than early; Ray's logs by what rotation bounds (pcl/tools/soak_logs.py: as many logs late as early, no file over
  the rotation size, no more backups than kept), the rest of Ray's session no higher late than early;
- the control plane's largest answers (a full /v1/history page, /metrics) under a size and a median latency.

Each growth is judged by its interval (`pcl.tools.soak_fit.Fit.judge`): `flat` when even the top of the interval
projects under the goal, `grows` when even its bottom projects over it, `unresolved` when the run is too short to
tell (a one-hour run cannot resolve 50 MB over 72 hours in a process whose memory moves by tens of MB): the
report names those, and the long run decides. A soak passes with no `grows` and nothing over its bound.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from pcl.tools.soak_fit import fit_slope
from pcl.tools.soak_logs import file_in_rotation, logs_row

HOURS = 72.0  # the run projected to: the paper's longest (3 days on DeepScaleR)
PRESET_STEPS = 300  # the presets' step count, trained in 2-3 days
GOALS = {"rss": 50e6, "threads": 5, "fds": 20, "redis": 50e6}  # growth over HOURS, per resource
HISTORY_SHARE = 0.5  # the capped history must fit in this share of Redis' maxmemory
# The per-step records, and what grows with them: the driver's output (a line a step), and the checkpoints, each of
# which holds a copy of metrics.jsonl and selections.jsonl up to its step (their number is bounded: checkpoints/#).
PER_STEP_FILES = ("metrics.jsonl", "selections.jsonl", "tensorboard/", "wandb/", "mlruns/", "trackio/",
                  "run-driver.log", "checkpoints/")
CONTROL_LIMITS = {"/v1/history?limit=1000": (2e6, 1.0), "/metrics": (256e3, 0.5)}  # bytes, median seconds
BOUNDED_SLACK = (1.10, 1 << 20)  # late max <= early max x 1.10 + 1 MiB (files)
STREAM_STEPS = 2  # a work stream holds at most this many steps' entries (m x n each)
WARMUP_S, WARMUP_SHARE = 300.0, 1 / 3  # warm-up: the larger of these, and past the first checkpoint
RESOURCES = ("rss", "threads", "fds")
FAILING = ("grows", "over bound", "missing")  # a verdict that fails the soak ("missing": nothing seen to judge)


@dataclass(frozen=True)
class Facts:
    """What the report needs of the config and the code: caps and the settings that bound what it sees."""

    m: int
    n: int
    checkpoint_every: int
    checkpoint_keep: int
    history_cap: int
    events_cap: int
    bounds: dict  # file or folder -> the setting that bounds it, as a sentence
    ray_rotation_bytes: int | None = None  # RAY_ROTATION_MAX_BYTES the run's Ray started with (None: unknown)
    ray_rotation_backups: int | None = None  # RAY_ROTATION_BACKUP_COUNT


def warmup_end(samples: list[dict], keep: int, warmup_s: float | None = None) -> float:
    """Seconds of warm-up: `warmup_s` if given, else the larger of WARMUP_S and WARMUP_SHARE of the run, and past the
    sample that first shows `keep` complete checkpoints (the first is a one-time jump in the processes that write
    it, and the folder fills to `keep` before it turns over)."""
    if warmup_s is not None:
        return warmup_s
    trained = [s["t"] for s in samples if s["t"] >= 0]
    end = max(WARMUP_S, WARMUP_SHARE * (max(trained) if trained else 0.0))
    counts = [(s["t"], s.get("files", {}).get("checkpoints/#", 0)) for s in samples]
    full = next((t for t, count in counts if count >= keep), None)
    return max(end, full if full is not None else next((t for t, count in counts if count), 0.0))


def growth(ts: list[float], steps: list[float], ys: list[float], goal: float | None) -> dict:
    """A series' slope per hour and per 1,000 steps with intervals, its projections, and its verdict against
    `goal` (growth over HOURS, per hour and per step at PRESET_STEPS; None: stated, not judged)."""
    hours = [t / 3600 for t in ts]
    per_h = fit_slope(hours, ys)
    row = {"start": ys[0], "end": ys[-1], "min": min(ys), "max": max(ys), "samples": len(ys),
           "per_hour": [per_h.slope, per_h.low, per_h.high], "per_72h": list(per_h.projected(HOURS))}
    verdicts = [per_h.judge(HOURS, goal)] if goal is not None else []
    if len(set(steps)) >= 3:
        per_k = fit_slope([s / 1000 for s in steps], ys)
        row["per_1000_steps"] = [per_k.slope, per_k.low, per_k.high]
        row["per_preset_run"] = list(per_k.projected(PRESET_STEPS / 1000))
        if goal is not None:
            verdicts.append(per_k.judge(PRESET_STEPS / 1000, goal))
    row["verdict"] = worst(verdicts) if verdicts else "stated"
    row["goal"] = goal
    return row


def worst(verdicts: list[str]) -> str:
    order = ("missing", "grows", "over bound", "unresolved", "flat", "bounded", "stated")
    return min(verdicts, key=order.index)


def bounded(ys: list[float], slack: tuple[float, float] = BOUNDED_SLACK) -> dict:
    """A series that may swing but must not climb: its late half's maximum against its early half's."""
    half = len(ys) // 2
    early, late = max(ys[:half] or ys), max(ys[half:] or ys)
    ok = late <= early * slack[0] + slack[1]
    return {"start": ys[0], "end": ys[-1], "min": min(ys), "max": max(ys), "early_max": early, "late_max": late,
            "samples": len(ys), "verdict": "bounded" if ok else "grows"}


def series(samples: list[dict], get) -> tuple[list[float], list[float], list[float]]:
    """(times, steps, values) of the samples where `get(sample)` is a number."""
    ts, steps, ys = [], [], []
    for s in samples:
        try:
            value = get(s)
        except (KeyError, TypeError, IndexError):
            continue
        if isinstance(value, (int, float)):
            ts.append(s["t"])
            steps.append(s["step"])
            ys.append(float(value))
    return ts, steps, ys


def processes(window: list[dict]) -> tuple[list[dict], list[str]]:
    """One row per process and resource over the window (processes seen in every sample of it); and the labels
    of the processes that came or went during it."""
    labels = [set(s.get("procs", {})) for s in window]
    steady = set.intersection(*labels) if labels else set()
    changed = sorted(set.union(*labels) - steady) if labels else []
    rows = []
    for label in sorted(steady):
        for i, resource in enumerate(RESOURCES):
            ts, steps, ys = series(window, lambda s: s["procs"][label][i])
            goal = None if (label.startswith("redis-server") and resource == "rss") else GOALS[resource]
            rows.append({"process": label, "resource": resource, **growth(ts, steps, ys, goal)})
    return rows, changed


def redis_rows(window: list[dict], facts: Facts, steps_per_hour: float) -> dict:
    """Redis: the memory other than the history (judged flat), the history's bytes a record and where it caps,
    each stream's length (bounded; the event log to its cap)."""
    with_redis = [s for s in window if s.get("redis")]
    if len(with_redis) < 3:
        return {"note": "fewer than 3 samples of the run's Redis"}
    ts, steps, rest = series(with_redis, lambda s: s["redis"]["used_memory"] - s["redis"]["history_bytes"])
    out: dict[str, Any] = {"other_memory": growth(ts, steps, rest, GOALS["redis"])}
    records = [s["redis"]["history_records"] for s in with_redis]
    sizes = [s["redis"]["history_bytes"] for s in with_redis]
    maxmemory = with_redis[-1]["redis"].get("maxmemory") or 0
    history: dict[str, Any] = {"records": records[-1], "bytes": sizes[-1], "cap": facts.history_cap}
    if len(set(records)) >= 3:
        per_record = fit_slope(records, sizes).slope
        at_cap = sizes[-1] + per_record * (facts.history_cap - records[-1])
        history.update(bytes_per_record=per_record, bytes_at_cap=at_cap,
                       hours_to_cap=(facts.history_cap - records[-1]) / steps_per_hour if steps_per_hour else None)
        if maxmemory:
            history["maxmemory"] = maxmemory
            history["verdict"] = "bounded" if at_cap <= HISTORY_SHARE * maxmemory else "over bound"
    if records[-1] >= facts.history_cap:
        capped = [s for s in with_redis if s["redis"]["history_records"] >= facts.history_cap]
        history["cap_reached_at"] = {"t": capped[0]["t"], "step": capped[0]["step"]}
        history["after_cap"] = bounded([s["redis"]["history_bytes"] for s in capped], (1.05, 0))
        history["verdict"] = worst([history.get("verdict", "bounded"), history["after_cap"]["verdict"]])
    out["history"] = history
    streams = {}
    for name in sorted({k for s in with_redis for k in s["redis"].get("streams", {})}):
        _, _, ys = series(with_redis, lambda s: s["redis"]["streams"][name])
        row = bounded(ys, (1.10, 16))
        # the event log grows by design to its cap (services/control/state.py EVENTS_MAXLEN); a work stream is
        # trimmed at each commit: a step's entries (m x n samples) and what a commit finds left of them
        row["cap"] = facts.events_cap if name == "events" else STREAM_STEPS * facts.m * facts.n
        row["verdict"] = "bounded" if max(ys) <= row["cap"] * 1.1 else "over bound"
        streams[name] = row
    out["streams"] = streams
    # Each client's connections (its pool: one per thread that ran a command while the others were in use) may not
    # climb after warm-up: a late one is a pool still growing with its load (the run's Redis' descriptors with it).
    clients = {}
    for name in sorted({k for s in with_redis for k in s["redis"].get("clients", {})}):
        ys = [s["redis"]["clients"].get(name, 0) for s in with_redis if "clients" in s["redis"]]
        if len(ys) >= 3:
            clients[name] = bounded(ys, (1.0, 0))
    out["clients"] = clients
    return out


def file_rows(window: list[dict], facts: Facts, key: str) -> dict[str, dict]:
    """Each file or folder of the run (`files`) or of its Ray session (`ray`): the per-step records' bytes per step
    (stated), everything else bounded (with the setting that bounds it, where one does)."""
    names = sorted({k for s in window for k in s.get(key, {})})
    out = {}
    for name in names:
        ts, steps, ys = series(window, lambda s: s[key][name])
        if len(ys) < 3:
            continue
        if key == "files" and name in PER_STEP_FILES:
            row = growth(ts, steps, ys, None)
            row["kind"] = "per step"
        elif key == "ray" and name.startswith("logs/") and name != "logs/":
            if max(ys) < (1 << 20):
                continue  # a small log: counted in logs/
            row = bounded(ys)  # a large one: under the rotation size
            row.update(kind="bounded", verdict=file_in_rotation(ys, facts.ray_rotation_bytes))
        elif name == "checkpoints/#":  # complete checkpoints: checkpoint.keep, a new one before the oldest goes,
            row = bounded(ys)           # and the best
            row.update(kind="bounded", verdict="bounded" if max(ys) <= facts.checkpoint_keep + 2 else "over bound")
        else:
            row = bounded(ys)
            row["kind"] = "bounded"
            row["per_hour"] = growth(ts, steps, ys, None)["per_hour"] if len(set(ts)) >= 3 else None
        row["bound"] = facts.bounds.get(name if key == "files" else f"ray:{name}")
        out[name] = row
    return out


def ray_rows(window: list[dict], facts: Facts) -> dict[str, dict]:
    """Ray's session: its logs/ by rotation (`soak_logs.logs_row`), each large log file under the rotation size,
    and the session other than its logs (sockets, runtime resources) no higher late than early."""
    logs = logs_row(window, facts.ray_rotation_bytes, facts.ray_rotation_backups)
    logs["bound"] = facts.bounds.get("ray:logs/")
    rows = {"logs/": logs}
    for name, row in file_rows(window, facts, "ray").items():
        if name.startswith("logs/") and name != "logs/":  # a large log file: under the rotation size
            rows[name] = {**row, "bound": f"rotated at {facts.ray_rotation_bytes / (1 << 20):g} MiB"
                          if facts.ray_rotation_bytes else None}
    ts, steps, rest = series(window, lambda s: s["ray"]["session/"] - s["ray"]["logs/"])
    if len(rest) >= 3:
        session = bounded(rest)
        session.update(kind="bounded", bound=facts.bounds.get("ray:session/"),
                       per_hour=growth(ts, steps, rest, None)["per_hour"] if len(set(ts)) >= 3 else None)
        rows["session/"] = session
    return rows


def control_rows(window: list[dict]) -> dict[str, dict]:
    out = {}
    for path, (max_bytes, max_s) in CONTROL_LIMITS.items():
        answered = [s["control"][path] for s in window if path in s.get("control", {})]
        if not answered:
            out[path] = {"verdict": "unresolved", "note": "never answered"}
            continue
        sizes, seconds = [a[0] for a in answered], [a[1] for a in answered]
        median = statistics.median(seconds)
        ok = max(sizes) <= max_bytes and median <= max_s
        out[path] = {"max_bytes": max(sizes), "median_s": median, "max_s": max(seconds), "limit_bytes": max_bytes,
                     "limit_median_s": max_s, "samples": len(answered), "verdict": "bounded" if ok else "over bound"}
    return out


def build_report(samples: list[dict], facts: Facts, run: dict, warmup_s: float | None = None) -> dict:
    """The whole report: {"run", "facts", "warmup_s", "pace", "processes", "redis", "files", "ray", "control",
    "verdicts", "notes", "passed"}."""
    trained = [s for s in samples if s["t"] >= 0 and s.get("state", "up") == "up"]  # not its start, not its end
    warm = warmup_end(trained, facts.checkpoint_keep, warmup_s)
    window = [s for s in trained if s["t"] >= warm]
    report: dict[str, Any] = {"run": run, "facts": asdict(facts), "warmup_s": warm, "notes": []}
    if len(window) < 3 or len({s["t"] for s in window}) < 3:
        report.update(passed=False, verdicts={})
        report["notes"].append(f"fewer than 3 samples after the warm-up ({warm:.0f} s): nothing can be judged")
        return report
    ts, steps = [s["t"] for s in window], [s["step"] for s in window]
    pace = fit_slope([t / 3600 for t in ts], steps).slope
    report["pace"] = {"steps": steps[-1], "hours": ts[-1] / 3600, "steps_per_hour": pace,
                      "seconds_per_step": 3600 / pace if pace > 0 else None}
    report["processes"], report["processes_changed"] = processes(window)
    report["redis"] = redis_rows(window, facts, pace)
    report["files"] = file_rows(window, facts, "files")
    report["ray"] = ray_rows(window, facts)
    report["control"] = control_rows(window)
    verdicts = [r["verdict"] for r in report["processes"]]
    redis = report["redis"]
    verdicts += [redis[k]["verdict"] for k in ("other_memory", "history") if "verdict" in redis.get(k, {})]
    verdicts += [r["verdict"] for part in ("streams", "clients") for r in redis.get(part, {}).values()]
    verdicts += [r["verdict"] for part in ("files", "ray", "control") for r in report[part].values()]
    report["verdicts"] = {v: verdicts.count(v) for v in sorted(set(verdicts))}
    traffic = run.get("traffic", {})
    if traffic.get("unexpected"):
        report["notes"].append(f"{len(traffic['unexpected'])} control requests got an unexpected answer")
    if run.get("leftover_processes"):
        report["notes"].append(f"{len(run['leftover_processes'])} processes outlived the run")
    if report["processes_changed"]:
        report["notes"].append("processes that came or went after warm-up: " + ", ".join(report["processes_changed"]))
    report["passed"] = (run.get("ended") == "finished" and not any(v in FAILING for v in verdicts)
                        and not traffic.get("unexpected") and not run.get("leftover_processes"))
    return report
