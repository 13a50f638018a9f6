"""The report of a cluster chaos run (`pcl chaos-cluster`): the faults injected by kind and node, each one's time to
recover (from its heal to the next step committed) and time for the run's throughput to come back (from the heal of
the last fault overlapping it), the steps redone
after restarts, the results dropped as stale by node, each invariant's result, and the seed and the schedule to
replay. Pure: built from what the driving side saw (commit times on its clock, the faults' injection and heal times).

    faults = recover(injected, commits, finished_at)            # pcl.tools.chaos_report: recovered_s
    faults = [throughput_back(f, commits, faults) for f in faults]
    checks.append(check_throughput(faults))
    report = build_cluster_report(schedule, faults, checks, run={...}, redone=..., stale_by_node={...}, replay=...)
    print(format_cluster_report(report, schedule))
"""

from __future__ import annotations

import statistics
from typing import Any

from pcl.tools.chaos_checks import Check
from pcl.tools.cluster_schedule import ClusterSchedule, format_cluster_schedule

PRE_STEPS = 6  # the pre-fault throughput: over the last this many commits before the injection
WINDOW_STEPS = 4  # throughput is back when this many consecutive commits after the heal come this fast ...
BACK_SHARE = 0.5  # ... at least this share of the pre-fault rate
BACK_LIMIT_S = 120.0  # ... within this many seconds of the heal
THROUGHPUT_KINDS = ("node_pause", "cut_redis", "cut_head", "cut_both", "packet_loss", "latency")
GOAL_MEDIAN_S = 60.0


def pre_fault_rate(commits: list[float], injected_s: float, n: int = PRE_STEPS) -> float | None:
    """Steps a second over the last `n` commits before `injected_s`; None with fewer than 3 of them."""
    before = [t for t in commits if t <= injected_s][-n:]
    if len(before) < 3 or before[-1] <= before[0]:
        return None
    return (len(before) - 1) / (before[-1] - before[0])


def back_after_s(commits: list[float], healed_s: float, rate: float, until_s: float | None = None,
                 window: int = WINDOW_STEPS, share: float = BACK_SHARE) -> float | None:
    """Seconds from `healed_s` to the end of the first run of `window` consecutive commits after it (each window
    from one commit to the `window`-th after, so `window` steps) at `share` x `rate` steps a second or faster, every
    commit of it before `until_s` (the next fault's injection); None when there is none."""
    after = [t for t in commits if t > healed_s and (until_s is None or t <= until_s)]
    first = [healed_s] + after  # the heal itself starts the first window
    for i in range(len(first) - window):
        span = first[i + window] - first[i]
        if span <= 0 or window / span >= share * rate:
            return round(first[i + window] - healed_s, 2)
    return None


def throughput_back(fault: dict, commits: list[float], faults: list[dict]) -> dict:
    """`fault` with `pre_rate` (steps/s before it), `all_healed_s` (when it and every fault overlapping it had
    healed, `all_healed`) and `back_s` (seconds from then until throughput came back, `back_after_s`, before the next
    fault's injection; None when it did not, or no pre-fault rate could be measured)."""
    fault = dict(fault)
    fault["pre_rate"] = fault["back_s"] = fault["all_healed_s"] = None
    if fault.get("injected_s") is None or fault.get("ended_s") is None:
        return fault
    rate = pre_fault_rate(commits, fault["injected_s"])
    join_s = WINDOW_STEPS / rate if rate else 0.0  # a gap to the next fault too short for 4 steps at the old pace
    healed = fault["all_healed_s"] = all_healed(fault, faults, join_s)
    if rate is not None:
        fault["pre_rate"] = round(rate, 3)
        fault["back_s"] = back_after_s(commits, healed, rate, next_injection(healed, faults))
    return fault


def all_healed(fault: dict, faults: list[dict], join_s: float = 0.0) -> float:
    """When `fault` and every fault overlapping it (injected before the last of them healed, or within `join_s`
    after: too soon for the throughput to show, in a chain) had healed: the run's throughput is judged after the
    partition, not while the next overlapping fault still holds."""
    healed, moved = fault["ended_s"], True
    while moved:
        moved = False
        for f in faults:
            if f.get("injected_s") is not None and f.get("ended_s") is not None and \
                    f["injected_s"] <= healed + join_s and healed < f["ended_s"]:
                healed, moved = f["ended_s"], True
    return healed


def next_injection(after_s: float, faults: list[dict]) -> float | None:
    """When the first fault injected after `after_s` was injected (None: none was)."""
    later = [f["injected_s"] for f in faults if f.get("injected_s") is not None and f["injected_s"] > after_s]
    return min(later) if later else None


def check_throughput(faults: list[dict], limit_s: float = BACK_LIMIT_S) -> Check:
    """After every healed fault of THROUGHPUT_KINDS with a measured pre-fault rate, throughput came back to
    BACK_SHARE of it within `limit_s` (before the next fault's injection)."""
    measured = [f for f in faults if f["kind"] in THROUGHPUT_KINDS and f.get("pre_rate") is not None]
    if not measured:
        return Check("throughput", False, "no partition or freeze with a measured pre-fault rate: nothing to check")
    slow = [f for f in measured if f.get("back_s") is None or f["back_s"] > limit_s]
    times = [f["back_s"] for f in measured if f.get("back_s") is not None]
    detail = (f"{len(measured) - len(slow)} of {len(measured)} partitions and freezes back to {BACK_SHARE:.0%} of "
              f"the pre-fault rate ({WINDOW_STEPS} steps) within {limit_s:g} s of the heal"
              + (f": median {statistics.median(times):.1f} s, max {max(times):.1f} s" if times else ""))
    if slow:
        detail += "; not: " + ", ".join(f"#{f['index']} {f['kind']} {f['target']} "
                                        f"({'never' if f.get('back_s') is None else str(f['back_s']) + ' s'})"
                                        for f in slow)
    return Check("throughput", not slow, detail)


def by_kind(faults: list[dict]) -> dict[str, dict[str, Any]]:
    """Per kind: scheduled, injected, recovered, the nodes hit and the recovery times' median and max."""
    out: dict[str, dict[str, Any]] = {}
    for f in faults:
        row = out.setdefault(f["kind"], {"scheduled": 0, "injected": 0, "recovered": 0, "nodes": {}, "times": []})
        row["scheduled"] += 1
        if f.get("injected_s") is not None:
            row["injected"] += 1
            row["nodes"][f["target"]] = row["nodes"].get(f["target"], 0) + 1
        if f.get("recovered_s") is not None:
            row["recovered"] += 1
            row["times"].append(f["recovered_s"])
    for row in out.values():
        times = row.pop("times")
        row["median_s"] = statistics.median(times) if times else None
        row["max_s"] = max(times) if times else None
    return out


def build_cluster_report(schedule: ClusterSchedule, faults: list[dict], checks: list[Check], run: dict[str, Any],
                         redone: int, stale: dict[str, int], replay: str) -> dict[str, Any]:
    """The report as a dict (written as JSON beside the text)."""
    injected = [f for f in faults if f.get("injected_s") is not None]
    times = [f["recovered_s"] for f in injected if f.get("recovered_s") is not None]
    median = statistics.median(times) if times else None
    recovered_all = len(times) == len(faults)
    passed = all(c.ok is True for c in checks) and bool(run.get("finished")) and recovered_all
    return {
        "seed": schedule.seed, "passed": passed, "run": run, "replay": replay, "faults": faults,
        "by_kind": by_kind(faults), "steps_redone": redone, "stale_by_node": stale,
        "recovery_s": {"median": median, "max": max(times) if times else None, "recovered": len(times),
                       "injected": len(injected), "scheduled": len(faults),
                       "goal_met": recovered_all and median is not None and median < GOAL_MEDIAN_S},
        "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in checks],
        "schedule": schedule.to_json(),
    }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_cluster_report(report: dict[str, Any], schedule: ClusterSchedule) -> str:
    """The report as text: the run, each fault, by kind, recovery, steps redone, stale drops by node, the
    invariants, the verdict, and the seed and schedule to replay."""
    run = report["run"]
    lines = [f"pcl chaos-cluster: seed {report['seed']}: {run.get('steps', '?')} steps in {_s(run.get('seconds'))} s, "
             f"{run.get('submissions', 1)} job submissions; "
             f"{'finished' if run.get('finished') else 'did NOT finish: ' + str(run.get('error'))}",
             "faults:", f"  {'#':>2}  {'kind':<13} {'node':<8} {'at':>7} {'held':>6} {'recovery':>8} "
                        f"{'rate back':>9}  note"]
    for f in report["faults"]:
        at = "-" if f.get("injected_s") is None else f"{f['injected_s']:6.1f}s"
        held = "-" if f.get("injected_s") is None or f.get("ended_s") is None else \
            f"{f['ended_s'] - f['injected_s']:5.1f}s"
        lost = f.get("injected_s") is not None and f.get("recovered_s") is None
        lines.append(f"  {f['index']:>2}  {f['kind']:<13} {f['target']:<8} {at:>7} {held:>6} "
                     f"{'no' if lost else _s(f.get('recovered_s')):>8} {_s(f.get('back_s')):>9}  {f.get('note', '')}")
    lines.append("by kind: " + "; ".join(
        f"{kind} {row['injected']}/{row['scheduled']} injected, {row['recovered']} recovered, median "
        f"{_s(row['median_s'])} s, max {_s(row['max_s'])} s (" +
        ", ".join(f"{n} {c}" for n, c in sorted(row["nodes"].items())) + ")"
        for kind, row in sorted(report["by_kind"].items())))
    rec = report["recovery_s"]
    lines.append(f"recovery: {rec['recovered']} of {rec['scheduled']} faults recovered ({rec['injected']} "
                 f"injected); time to recover median {_s(rec['median'])} s, max {_s(rec['max'])} s; goal (median "
                 f"under {GOAL_MEDIAN_S:g} s, every fault recovered) {'met' if rec['goal_met'] else 'NOT met'}")
    lines.append(f"steps redone after restarts: {report['steps_redone']}")
    stale = report["stale_by_node"]
    lines.append("dropped as stale, by node: " + (", ".join(f"{n} {c}" for n, c in stale.items()) or "none"))
    lines.append("invariants:")
    lines += [f"  {c['status']} {c['name']}: {c['detail']}" for c in report["checks"]]
    lines.append(f"result: {'PASS' if report['passed'] else 'FAIL'}")
    lines.append(f"replay with: {report['replay']}")
    lines.append(format_cluster_schedule(schedule))
    return "\n".join(lines)
