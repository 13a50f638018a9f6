"""The soak report as text (`pcl soak` prints it and writes it to OUT/soak_report.txt): the run and its pace, then
one table per part (processes, Redis, files, Ray's session, the control plane), each growth as a slope per hour
and per 1,000 steps with its 95% interval and its projection over 72 hours at the presets' pace and at this run's,
each row's verdict, what is unresolved, and `result: PASS` or `result: FAIL`.

    print(format_report(build_report(samples, facts, run)))    # pcl.tools.soak_report
"""

from __future__ import annotations

from pcl.tools.soak_report import GOALS, HOURS, PRESET_STEPS


def size(value: float | None, resource: str = "bytes") -> str:
    """Bytes as kB / MB / GB (signed where negative); counts as they are."""
    if value is None:
        return "-"
    if resource in ("threads", "fds", "entries", "records"):
        return f"{value:.1f}" if abs(value) < 100 and value != int(value) else f"{value:.0f}"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def interval(triple: list[float] | None, resource: str = "bytes") -> str:
    if not triple:
        return "-"
    slope, low, high = triple
    return f"{size(slope, resource)} [{size(low, resource)}, {size(high, resource)}]"


def _header(report: dict) -> list[str]:
    run, pace = report["run"], report.get("pace", {})
    lines = [f"pcl soak: {run.get('minutes', 0):g} minutes asked; the run {run.get('ended')}"]
    if pace:
        per = pace.get("seconds_per_step")
        lines.append(f"pace: {pace['steps']} steps in {pace['hours']:.2f} h of training, "
                     f"{pace['steps_per_hour']:.0f} steps/h ({per:.2f} s a step)" if per else "pace: no steps")
        lines.append(f"72 h projections: at the presets' pace ({PRESET_STEPS} steps: growth per step x "
                     f"{PRESET_STEPS}) and per hour x {HOURS:g} (this run's pace: "
                     f"{pace['steps_per_hour'] * HOURS:,.0f} steps); slopes after a warm-up of "
                     f"{report['warmup_s']:.0f} s, 95% intervals")
    traffic = run.get("traffic", {})
    if traffic:
        lines.append(f"control traffic: {traffic.get('requests', 0)} requests, answers "
                     + ", ".join(f"{k}: {v}" for k, v in sorted(traffic.get("by_status", {}).items()))
                     + f"; unexpected: {len(traffic.get('unexpected', []))}")
    return lines


def _processes(report: dict) -> list[str]:
    lines = [f"processes (goal: growth over {HOURS:g} h under {size(GOALS['rss'])} RSS, {GOALS['threads']} threads, "
             f"{GOALS['fds']} descriptors)",
             f"  {'process':<26}{'what':<8}{'start':>10}{'end':>10}  {'per hour [95%]':<30}{'per 1000 steps':<30}"
             f"{'300 steps':>11}{'72 h':>11}  verdict"]
    for r in report.get("processes", []):
        res = r["resource"]
        unit = "bytes" if res == "rss" else res
        lines.append(f"  {r['process'][:25]:<26}{res:<8}{size(r['start'], unit):>10}{size(r['end'], unit):>10}  "
                     f"{interval(r['per_hour'], unit):<30}{interval(r.get('per_1000_steps'), unit):<30}"
                     f"{size((r.get('per_preset_run') or [None])[0], unit):>11}{size(r['per_72h'][0], unit):>11}  "
                     f"{r['verdict']}")
    return lines


def _redis(report: dict) -> list[str]:
    redis = report.get("redis", {})
    if "note" in redis:
        return [f"redis: {redis['note']}"]
    other, history = redis["other_memory"], redis["history"]
    lines = ["redis",
             f"  memory other than the history: {size(other['start'])} -> {size(other['end'])}, per hour "
             f"{interval(other['per_hour'])}, per 1000 steps {interval(other.get('per_1000_steps'))}, 72 h "
             f"{size(other['per_72h'][0])}: {other['verdict']}"]
    text = f"  control history: {history['records']} records, {size(history['bytes'])}"
    if "bytes_per_record" in history:
        hours = history.get("hours_to_cap")
        text += (f"; {history['bytes_per_record']:.0f} bytes a record; its cap of {history['cap']:,} records is "
                 f"{size(history['bytes_at_cap'])}")
        if "maxmemory" in history:
            text += f" ({history['bytes_at_cap'] / history['maxmemory']:.0%} of maxmemory {size(history['maxmemory'])})"
        if "cap_reached_at" in history:
            reached = history["cap_reached_at"]
            text += f"; reached at step {reached['step']} ({reached['t'] / 3600:.2f} h), flat after: " \
                    f"{history['after_cap']['verdict']}"
        elif hours is not None:
            text += f"; reached in {hours:.1f} more hours at this pace, never in a {PRESET_STEPS}-step preset run"
    lines.append(text + f": {history.get('verdict', 'stated')}")
    for name, row in redis.get("streams", {}).items():
        lines.append(f"  stream {name}: length max {row['max']:.0f} (early {row['early_max']:.0f}, late "
                     f"{row['late_max']:.0f}), bound {row['cap']:,}: {row['verdict']}")
    for name, row in redis.get("clients", {}).items():
        lines.append(f"  connections of {name}: {row['start']:.0f} -> {row['end']:.0f} (early max "
                     f"{row['early_max']:.0f}, late {row['late_max']:.0f}): {row['verdict']}")
    return lines


def _logs(name: str, row: dict) -> str:
    """Ray's logs/: the logs early and late, the largest file, the bound rotation sets, the growth an hour."""
    if "logs" not in row:
        return f"  {name:<36}{'-':>10}  {row['note']}: {row['verdict']}"
    rotation, backups = row.get("rotation_bytes"), row.get("rotation_backups")
    if "bound_bytes" in row:
        bound = (f"{row['logs']} logs, each at most {backups + 1} x {rotation / (1 << 20):g} MiB: at most "
                 f"{size(row['bound_bytes'])}")
    else:
        bound = f"{row['logs']} logs, rotation unknown"
    note = f"; {row['note']}" if row.get("note") and row["verdict"] != "bounded" else ""
    return (f"  {name:<36}{size(row['end']):>10}  logs: early max {row['logs_early_max']}, late "
            f"{row['logs_late_max']}; largest file {size(row['largest_file'])} ({row['largest_path']}), most backups "
            f"{row['most_backups']}; grows {interval(row.get('per_hour'))} an hour{note}; {row['verdict']}: {bound}")


def _files(report: dict, part: str, title: str) -> list[str]:
    lines = [title]
    for name, row in report.get(part, {}).items():
        if row["kind"] == "logs":
            lines.append(_logs(name, row))
        elif row["kind"] == "per step":
            per_k = row.get("per_1000_steps")
            per_step = f"{per_k[0] / 1000:,.0f} bytes a step [{per_k[1] / 1000:,.0f}, {per_k[2] / 1000:,.0f}]" \
                if per_k else "-"
            lines.append(f"  {name:<36}{size(row['end']):>10}  per step: {per_step}; {PRESET_STEPS} steps "
                         f"{size((row.get('per_preset_run') or [None])[0])}, 72 h at this pace "
                         f"{size(row['per_72h'][0])}")
        else:
            unit = "entries" if name.endswith("#") else "bytes"  # checkpoints/#: how many complete checkpoints
            name = "session/ other than logs/" if (part, name) == ("ray", "session/") else name
            bound = f"; bound: {row['bound']}" if row.get("bound") else ""
            lines.append(f"  {name:<36}{size(row['end'], unit):>10}  max {size(row['max'], unit)} (early "
                         f"{size(row['early_max'], unit)}, late {size(row['late_max'], unit)}){bound}: {row['verdict']}")
    return lines


def _control(report: dict) -> list[str]:
    lines = ["control plane"]
    for path, row in report.get("control", {}).items():
        if "note" in row:
            lines.append(f"  {path}: {row['note']}: {row['verdict']}")
            continue
        lines.append(f"  {path}: largest {size(row['max_bytes'])} (limit {size(row['limit_bytes'])}), median "
                     f"{row['median_s']:.3f} s (limit {row['limit_median_s']:g} s), max {row['max_s']:.3f} s: "
                     f"{row['verdict']}")
    return lines


def format_report(report: dict) -> str:
    lines = _header(report)
    if "processes" in report:
        lines += _processes(report) + _redis(report) + _files(report, "files", "files of the run") \
            + _files(report, "ray", "Ray's session") + _control(report)
        if report.get("processes_changed"):
            lines.append("processes that came or went after warm-up: " + ", ".join(report["processes_changed"]))
        unresolved = [f"{r['process']} {r['resource']}" for r in report["processes"] if r["verdict"] == "unresolved"]
        if unresolved:
            lines.append(f"unresolved (the interval holds the goal: a longer run decides): {', '.join(unresolved)}")
    lines += [f"note: {note}" for note in report.get("notes", [])]
    lines.append("verdicts: " + ", ".join(f"{k} {v}" for k, v in report.get("verdicts", {}).items()))
    lines.append(f"result: {'PASS' if report['passed'] else 'FAIL'}")
    return "\n".join(lines)
