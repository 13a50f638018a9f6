"""The report of a chaos run (`pcl chaos`): the faults injected by kind and the phase each landed in, whether and how
fast the run recovered from each, the steps redone after restarts, the control plane's answers, each invariant's
result and, on a failure, the seed and the schedule to replay it. Pure: built from what the driving side saw.

    timeline = [("commit", 31.2, 1), ("commit", 33.0, 2), ("restored", 70.4, 0), ...]
    faults = recover(injected, commit_times(timeline), finished_at)   # each fault's recovery time, or None
    report = build_report(schedule, faults, checks, run={...}, redone=steps_redone(timeline), replay="pcl chaos ...")
    print(format_report(report))
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from pcl.tools.chaos_checks import Check
from pcl.tools.chaos_schedule import Schedule, format_schedule

RUN_ENDED = "not injected (run ended)"  # the note of a fault the run ended before (entrypoints/chaos/faults.py)


def commit_times(timeline: list[tuple[str, float, int]]) -> list[float]:
    """When steps were committed (a new step record appeared), in order."""
    return sorted(t for what, t, _ in timeline if what == "commit")


def steps_redone(timeline: list[tuple[str, float, int]]) -> int:
    """Steps committed and then trained again: at each restore to step N (a restart from a checkpoint, or from the
    start: N = 0), the steps committed since the previous (re)start beyond N."""
    redone, high = 0, 0
    for what, _, step in sorted(timeline, key=lambda e: e[1]):
        if what == "commit":
            high = max(high, step)
        elif what == "restored":
            redone += max(0, high - step)
            high = step
    return redone


def recover(faults: list[dict], commits: list[float], finished_at: float | None) -> list[dict]:
    """Each fault dict gains `recovered_s`: seconds from its end (`ended_s`) to the next step committed (or, with
    none after it, to the clean end of the run at `finished_at`); None when the run never got there. A fault
    that was not injected (`injected_s` None) gets None too."""
    out = []
    for fault in faults:
        fault = dict(fault)
        end = fault.get("ended_s", fault.get("injected_s"))
        fault["recovered_s"] = None
        if fault.get("injected_s") is not None and end is not None:
            later = [t for t in commits if t > end]
            if later:
                fault["recovered_s"] = round(later[0] - end, 2)
            elif finished_at is not None:
                fault["recovered_s"] = round(max(0.0, finished_at - end), 2)
        out.append(fault)
    return out


def build_report(schedule: Schedule, faults: list[dict], checks: list[Check], run: dict[str, Any], redone: int,
                 replay: str) -> dict[str, Any]:
    """The report as a dict (written as JSON beside the text)."""
    injected = [f for f in faults if f.get("injected_s") is not None]
    times = [f["recovered_s"] for f in injected if f.get("recovered_s") is not None]
    by_kind: dict[str, dict[str, int]] = {}
    for f in faults:
        row = by_kind.setdefault(f["kind"], {"scheduled": 0, "injected": 0, "recovered": 0})
        row["scheduled"] += 1
        row["injected"] += f.get("injected_s") is not None
        row["recovered"] += f.get("recovered_s") is not None
    missed = [f for f in faults if f.get("injected_s") is None]
    failed = [c for c in checks if c.ok is not True] + [None] * bool(missed or not run.get("finished"))
    return {
        "seed": schedule.seed, "passed": not failed, "run": run, "replay": replay,
        "faults": faults, "by_kind": by_kind,
        "not_injected": {"run_ended": sum(f.get("note") == RUN_ENDED for f in missed),
                         "other": sum(f.get("note") != RUN_ENDED for f in missed)},
        "phases": dict(Counter(f.get("phase") for f in injected)),
        "recovery_s": {"median": statistics.median(times) if times else None, "max": max(times) if times else None,
                       "recovered": len(times), "injected": len(injected)},
        "steps_redone": redone,
        "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in checks],
        "schedule": schedule.to_json() if failed else None,
    }


def _injected_line(report: dict[str, Any], schedule: Schedule) -> str:
    """How many faults were injected; those that were not, and why (the run ended first: the window outlasted it)."""
    missed = report.get("not_injected", {})
    line = f"injected: {len(report['faults']) - sum(missed.values())} of {len(report['faults'])} faults"
    if missed.get("run_ended"):
        line += (f"; {missed['run_ended']} {RUN_ENDED}: the {schedule.window_s:g} s window outlasted the run "
                 f"(a shorter --window, or --step-seconds)")
    if missed.get("other"):
        line += f"; {missed['other']} not injected for another reason (see their notes)"
    return line


def _started_again_line(restarts: list[list[str]]) -> str:
    """How many actors the restarts from a checkpoint started again, by role (the rest were kept)."""
    roles = Counter(name.split("-")[0] for names in restarts for name in names)
    return (f"restarts from a checkpoint: {len(restarts)}; actors started again: "
            + (", ".join(f"{role} {count}" for role, count in sorted(roles.items())) or "none"))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_report(report: dict[str, Any], schedule: Schedule) -> str:
    """The report as text: the run, each fault, by kind, recovery, steps redone, invariants, the verdict; on a
    failure the seed, the replay command and the whole schedule."""
    run = report["run"]
    lines = [f"pcl chaos: seed {report['seed']}: {run.get('steps', '?')} steps in {_seconds(run.get('seconds'))} s, "
             f"{run.get('restarts', 0)} fleet restarts, {run.get('resumes', 0)} driver resumes; "
             f"{'finished' if run.get('finished') else 'did NOT finish: ' + str(run.get('error'))}",
             "faults:", f"  {'#':>2}  {'kind':<17} {'at':>7}  {'phase':<17} {'recovery':>8}  target / note"]
    for f in report["faults"]:
        at = "not injected" if f.get("injected_s") is None else f"{f['injected_s']:6.1f}s"
        lost = f.get("injected_s") is not None and f.get("recovered_s") is None
        rec = "no" if lost else _seconds(f.get("recovered_s"))
        lines.append(f"  {f['index']:>2}  {f['kind']:<17} {at:>7}  {str(f.get('phase') or '-'):<17} {rec:>8}  "
                     f"{f.get('note', '')}")
    lines.append("by kind: " + ", ".join(f"{kind} {row['injected']}/{row['scheduled']} injected, {row['recovered']} "
                                         f"recovered" for kind, row in sorted(report["by_kind"].items())))
    lines.append(_injected_line(report, schedule))
    lines.append("phases hit: " + ", ".join(f"{p} {c}" for p, c in sorted(report["phases"].items(), key=str)))
    rec = report["recovery_s"]
    lines.append(f"recovery: {rec['recovered']} of {rec['injected']} injected faults recovered; time to recover "
                 f"median {_seconds(rec['median'])} s, max {_seconds(rec['max'])} s")
    lines.append(f"steps redone after restarts: {report['steps_redone']}")
    lines.append(_started_again_line(run.get("started_again") or []))
    lines.append("invariants:")
    lines += [f"  {c['status']} {c['name']}: {c['detail']}" for c in report["checks"]]
    lines.append(f"result: {'PASS' if report['passed'] else 'FAIL'}")
    if not report["passed"]:
        lines.append(f"replay with: {report['replay']}")
        lines.append(format_schedule(schedule))
    return "\n".join(lines)
