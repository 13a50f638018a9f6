"""The invariants that a partition adds to a chaos run's (`pcl.tools.chaos_checks`): a node cut off from the head or
from Redis keeps running and may write late, and its actors may be started again elsewhere meanwhile. Pure, like
those: each check takes what was read and returns a `Check`; fed nothing, it fails.

    check_incarnations(incarnations, expected_instances(cfg))   # services/incarnations.py: read_incarnations
    check_stale_results(metrics_lines, incarnations)            # the step records' dropped_stale_by_producer
    check_freezes(faults, timeline)                             # a chaos run's SIGSTOPped workers (liveness)

- incarnations: every long-lived actor beat its heartbeat (each instance the run's config starts was seen), and no
  two incarnations of one instance (two processes acting as `rollout-1`) beat over the same span of time, in the
  Redis server's clock: an actor is started again only once its previous process is gone;
- stale results: the results the collector dropped as stale (for a step or a policy version the run had moved
  past), counted by the node and incarnation that produced them; the count never goes back from one step record
  to the next. That none of them was trained on is the `steps`, `batches` and `versions` checks' to show;
- frozen workers: a worker frozen (SIGSTOP) for FREEZE_LIVE_S or longer did not freeze the run: a step was committed
  while it was stopped, from FREEZE_GRACE_S after it stopped (its straggler timeout, then a step) to its end; a
  freeze that another fault's span (from its injection to its recovery) or a restart overlaps is excused, counted.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from pcl.tools.chaos_checks import Check, _joined, _listed


FREEZE_LIVE_S = 20.0  # a freeze held this long must leave the run training
FREEZE_GRACE_S = 15.0  # from this long after it began: the derived straggler timeout's 10 s floor, then a step


def expected_instances(cfg) -> set[str]:
    """The actor instances the run's config starts (their heartbeats' `instance`): the coordinator, the sampler,
    each learner rank, rollout worker and verifier, and V's ranks when the strategy uses V."""
    from pcl.strategies import strategy_class

    out = {"coordinator", "sampler"}
    out |= {f"learner-{i}" for i in range(cfg.learner.num_ranks)}
    out |= {f"rollout-{i}" for i in range(cfg.rollout.num_workers)}
    out |= {f"verifier-{i}" for i in range(cfg.verifier.num_workers)}
    if strategy_class(cfg.selection).needs_values:
        out |= {f"scorer-{i}" for i in range(cfg.value.num_ranks)}
    return out


def _where(entry: dict) -> str:
    return f"{entry['incarnation']} on {entry.get('host') or '?'} (node {str(entry.get('node') or '?')[:12]})"


def overlaps(incarnations: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of incarnations of one instance whose beats overlap in time: the later one began before the earlier
    one's last beat (first..last, the server's clock, in ms)."""
    by_instance: dict[str, list[dict]] = defaultdict(list)
    for entry in incarnations:
        by_instance[entry["instance"]].append(entry)
    pairs = []
    for entries in by_instance.values():
        entries = sorted(entries, key=lambda e: e["first_ms"])
        for i, a in enumerate(entries):
            pairs += [(a, b) for b in entries[i + 1:] if b["first_ms"] < a["last_ms"]]
    return pairs


def check_incarnations(incarnations: list[dict], expected: set[str]) -> Check:
    """`incarnations`: the run's registry (`services.incarnations.read_incarnations`: instance, incarnation, node,
    host, first_ms, last_ms); `expected`: the instances its config starts. Every expected instance beat, and no
    two incarnations of one instance beat at once."""
    if not incarnations:
        return Check("incarnations", False, "no actor's heartbeat was recorded: nothing to check")
    problems = []
    missing = sorted(expected - {e["instance"] for e in incarnations})
    if missing:
        problems.append(f"no heartbeat from {_listed(missing)}")
    for a, b in overlaps(incarnations):
        together_s = (min(a["last_ms"], b["last_ms"]) - b["first_ms"]) / 1000
        problems.append(f"{a['instance']}: two live incarnations for {together_s:.1f} s, {_where(a)} and "
                        f"{_where(b)}")
    starts = Counter(e["instance"] for e in incarnations)
    summary = (f"{len(incarnations)} incarnations of {len(starts)} instances ("
               + ", ".join(f"{name} {count}" for name, count in sorted(starts.items())) + ")")
    ok = not problems
    return Check("incarnations", ok, summary + ", never two of one instance at once" if ok
                 else summary + "; " + _joined(problems))


def stale_by_node(counts: dict[str, int], incarnations: list[dict]) -> dict[str, int]:
    """Stale results by the host that produced them: `counts` is keyed "worker@incarnation" (the step record's
    `dropped_stale_by_producer`), each incarnation's host taken from the registry ("?" when it has none)."""
    hosts = {e["incarnation"]: e.get("host") or "?" for e in incarnations}
    out: Counter[str] = Counter()
    for producer, count in counts.items():
        out[hosts.get(producer.rpartition("@")[2], "?")] += count
    return dict(sorted(out.items()))


def check_stale_results(metrics_lines: list[dict], incarnations: list[dict]) -> Check:
    """The step records' cumulative `dropped_stale_by_producer` ({"rollout-1@<incarnation>": results dropped as
    stale}): recorded by every step record and never going back; reported by node (the registry's host of each
    incarnation) and by producer."""
    records = [r for r in metrics_lines if "effective_ratio" in r]
    if not records:
        return Check("stale results", False, "metrics.jsonl: no step records")
    unrecorded = [r["step"] for r in records if r.get("dropped_stale_by_producer") is None]
    if unrecorded:
        return Check("stale results", False, f"step records without dropped_stale_by_producer (not recorded by "
                                             f"this version of the collector): steps {_listed(unrecorded)}")
    problems = []
    for before, after in zip(records, records[1:]):
        back = [k for k, v in before["dropped_stale_by_producer"].items()
                if after["dropped_stale_by_producer"].get(k, 0) < v]
        if back:
            problems.append(f"step {after['step']}: the count went back for {_listed(back)}")
    last = records[-1]["dropped_stale_by_producer"]
    summary = f"{sum(last.values())} results dropped as stale"
    if last:
        by_node = ", ".join(f"{host} {count}" for host, count in stale_by_node(last, incarnations).items())
        summary += f": by node {by_node}; by producer " + ", ".join(f"{p} {c}" for p, c in sorted(last.items()))
    ok = not problems
    return Check("stale results", ok, summary if ok else summary + "; " + _joined(problems))


def check_freezes(faults: list[dict], timeline: list[tuple[str, float, int]]) -> Check:
    """`faults`: a chaos run's faults with their times (kind, injected_s, ended_s, recovered_s:
    `pcl.tools.chaos_report.recover`); `timeline`: its ("commit" | "restored", seconds, step) events. Every freeze
    held FREEZE_LIVE_S or longer saw a step committed between FREEZE_GRACE_S into it and its end, unless another
    fault's span or a restart overlaps that (excused, counted)."""
    freezes = [f for f in faults if f["kind"] == "freeze" and f.get("injected_s") is not None]
    if not freezes:
        return Check("frozen workers", False, "no freeze was injected: nothing to check")
    others = [(f["injected_s"], f.get("ended_s", f["injected_s"]) + (f.get("recovered_s") or 0.0))
              for f in faults if f["kind"] != "freeze" and f.get("injected_s") is not None]
    restores = [t for what, t, _ in timeline if what == "restored"]
    commits = [t for what, t, _ in timeline if what == "commit"]
    kept, excused, stalled, short = [], 0, [], 0
    for f in freezes:
        start, end = f["injected_s"] + FREEZE_GRACE_S, f.get("ended_s", f["injected_s"])
        if end - f["injected_s"] < FREEZE_LIVE_S:
            short += 1
        elif any(start < t <= end for t in commits):
            kept.append(sum(start < t <= end for t in commits))
        elif any(a < end and b > start for a, b in others) or any(start - 30 < t <= end for t in restores):
            excused += 1
        else:
            stalled.append(f"#{f['index']} at {f['injected_s']:.1f} s, held {end - f['injected_s']:.1f} s")
    detail = (f"{len(freezes)} freezes: {len(kept)} held {FREEZE_LIVE_S:g} s or longer with the run training on "
              f"({_listed(kept)} steps from {FREEZE_GRACE_S:g} s in), {short} shorter, {excused} overlapped by "
              f"another fault or a restart")
    return Check("frozen workers", not stalled, detail if not stalled else
                 detail + "; no step while stopped: " + _joined(stalled))
