"""The cluster chaos run's pure parts: the schedule drawn from a seed (pcl/tools/cluster_schedule.py) and the report
built from what the driving side saw (pcl/tools/cluster_report.py): recovery and throughput-back times, the checks,
the text. The run itself is `make test-chaos-cluster` (Docker)."""

from __future__ import annotations

import pytest

from pcl.tools.chaos_checks import Check
from pcl.tools.chaos_report import recover
from pcl.tools.cluster_report import (BACK_LIMIT_S, all_healed, back_after_s, build_cluster_report, by_kind,
                                      check_throughput, format_cluster_report, next_injection, pre_fault_rate,
                                      throughput_back)
from pcl.tools.cluster_schedule import (CLUSTER_KINDS, ClusterSchedule, check_cluster_schedule,
                                        draw_cluster_schedule, format_cluster_schedule, schedule_steps)


@pytest.mark.parametrize("seed", range(12))
def test_every_seed_draws_a_schedule_that_meets_the_rules(seed):
    schedule = draw_cluster_schedule(seed, per_kind=2)
    assert check_cluster_schedule(schedule, per_kind=2) == []
    assert len(schedule.faults) == 2 * len(CLUSTER_KINDS) and schedule.kinds == sorted(CLUSTER_KINDS)
    assert ClusterSchedule.from_json(schedule.to_json()) == schedule
    assert schedule_steps(schedule) >= sum(f.after_steps for f in schedule.faults) + 10


def test_the_schedule_is_a_function_of_the_seed():
    assert draw_cluster_schedule(5) == draw_cluster_schedule(5)
    assert draw_cluster_schedule(5) != draw_cluster_schedule(6)


def test_the_two_regimes_are_both_drawn_and_named():
    schedule = draw_cluster_schedule(3, per_kind=2)
    for kind in ("node_pause", "cut_redis", "cut_head", "cut_both"):
        faults = [f for f in schedule.faults if f.kind == kind]
        assert {f.regime for f in faults} == {"short", "long"}, faults
        long = next(f for f in faults if f.regime == "long")
        assert long.hold_s > 28.0  # longer than the chaos cluster's Ray node death (deploy/chaos-cluster.yml)
    assert "long" in format_cluster_schedule(schedule) and "short" in format_cluster_schedule(schedule)


def test_the_checker_names_what_breaks_the_rules():
    schedule = draw_cluster_schedule(1, per_kind=2)
    broken = ClusterSchedule(1, schedule.faults[:-1])
    assert any("not 2" in p for p in check_cluster_schedule(broken, per_kind=2))
    with pytest.raises(ValueError):
        draw_cluster_schedule(1, kinds=("no_such_kind",))


def test_pre_fault_rate_and_throughput_back():
    commits = [float(t) for t in range(10)]  # 1 step/s
    assert pre_fault_rate(commits, 9.5) == pytest.approx(1.0)
    assert pre_fault_rate(commits[:2], 9.5) is None  # too few commits to measure
    # healed at 20: steps come at 2 s apart (half the rate) for a while, then at 1 s again
    after = [22.0, 24.0, 26.0, 28.0, 29.0, 30.0, 31.0, 32.0]
    assert back_after_s(commits + after, 20.0, 1.0, share=0.5) == pytest.approx(8.0)  # 4 steps in 8 s: 0.5/s
    assert back_after_s(commits + after, 20.0, 1.0, share=0.9) == pytest.approx(12.0)  # 28..32 at 1/s
    assert back_after_s(commits + after, 20.0, 1.0, until_s=30.0, share=0.9) is None  # the next fault came first


def test_recovery_throughput_and_the_check():
    commits = [float(t) for t in range(10)] + [40.0 + t for t in range(10)]
    faults = [{"index": 0, "kind": "cut_redis", "target": "rollout", "injected_s": 9.5, "ended_s": 38.0},
              {"index": 1, "kind": "node_kill", "target": "learner", "injected_s": 45.5, "ended_s": 46.0},
              {"index": 2, "kind": "latency", "target": "rollout2", "injected_s": None, "ended_s": None}]
    faults = recover(faults, commits, 50.0)
    assert [f["recovered_s"] for f in faults] == [2.0, 1.0, None]
    assert next_injection(38.0, faults) == 45.5
    faults = [throughput_back(f, commits, faults) for f in faults]
    assert faults[0]["pre_rate"] == pytest.approx(1.0) and faults[0]["back_s"] == pytest.approx(5.0)
    check = check_throughput(faults)
    assert check.ok is True and "1 of 1" in check.detail
    slow = [dict(faults[0], back_s=BACK_LIMIT_S + 1)]
    assert check_throughput(slow).ok is False
    assert check_throughput([dict(faults[0], back_s=None)]).ok is False  # never back: a failure
    assert check_throughput([faults[1]]).ok is False  # nothing of the kinds it checks: nothing checked
    rows = by_kind(faults)
    assert rows["cut_redis"] == {"scheduled": 1, "injected": 1, "recovered": 1, "nodes": {"rollout": 1},
                                 "median_s": 2.0, "max_s": 2.0}
    assert rows["latency"]["injected"] == 0


def test_the_report_passes_only_with_every_fault_recovered_and_every_check_passed():
    schedule = draw_cluster_schedule(2, per_kind=1, kinds=("node_kill", "cut_head"))
    faults = [{"index": f.index, "kind": f.kind, "target": f.target, "injected_s": 10.0 * (i + 1),
               "ended_s": 10.0 * (i + 1) + 3, "recovered_s": 4.0, "back_s": 6.0, "note": "done"}
              for i, f in enumerate(schedule.faults)]
    run = {"steps": 40, "seconds": 80.0, "finished": True, "submissions": 1}
    good = build_cluster_report(schedule, faults, [Check("steps", True, "ok")], run, 3, {"rollout": 2}, "replay")
    assert good["passed"] and good["recovery_s"]["goal_met"] and good["recovery_s"]["median"] == 4.0
    text = format_cluster_report(good, schedule)
    assert "result: PASS" in text and "dropped as stale, by node: rollout 2" in text and "steps redone" in text
    assert "replay with: replay" in text and f"schedule of seed {schedule.seed}" in text
    lost = [dict(faults[0], recovered_s=None)] + faults[1:]
    assert not build_cluster_report(schedule, lost, [Check("steps", True, "ok")], run, 0, {}, "r")["passed"]
    failed = build_cluster_report(schedule, faults, [Check("steps", False, "twice")], run, 0, {}, "r")
    assert not failed["passed"] and "FAIL steps" in format_cluster_report(failed, schedule)


def test_throughput_is_judged_once_every_overlapping_fault_has_healed():
    # Seed 2: a short cut of the learner from Redis healed at 572.5 s while two packet-loss faults it overlapped held
    # on (to 589 s and 597 s); judged from its own heal, the next fault's injection 1 s later left no window and it
    # counted as "never back".
    faults = [{"index": 9, "kind": "cut_redis", "target": "learner", "injected_s": 566.7, "ended_s": 572.5},
              {"index": 10, "kind": "packet_loss", "target": "rollout2", "injected_s": 571.0, "ended_s": 589.3},
              {"index": 11, "kind": "packet_loss", "target": "rollout", "injected_s": 573.6, "ended_s": 597.1},
              {"index": 12, "kind": "redis_restart", "target": "redis", "injected_s": 620.0, "ended_s": 625.0}]
    assert all_healed(faults[0], faults) == 597.1 and all_healed(faults[3], faults) == 625.0
    commits = [550.0 + t for t in range(16)] + [598.0 + t for t in range(10)]
    cut = throughput_back(faults[0], commits, faults)
    assert cut["all_healed_s"] == 597.1 and cut["pre_rate"] == pytest.approx(1.0)
    assert cut["back_s"] == pytest.approx(601.0 - 597.1, abs=0.01)  # 4 steps after the heal: 598 .. 601, at 1/s
    assert check_throughput([cut]).ok is True


def test_a_fault_injected_before_its_predecessors_throughput_could_show_joins_the_chain():
    # Seed 1 (2026-11-28): a short cut from Redis healed at 70.7 s and the driver was killed 0.5 s later (the
    # schedule had it overlap the cut, 3.6 s after its injection): judged alone, the cut had 0.5 s to show 4 steps
    # and counted as "never back". A window shorter than 4 steps at the pre-fault rate cannot show it: the
    # next fault joins the chain and the cut is judged once both have healed.
    faults = [{"index": 1, "kind": "cut_redis", "target": "rollout", "injected_s": 67.3, "ended_s": 70.7},
              {"index": 2, "kind": "driver_kill", "target": "driver", "injected_s": 71.2, "ended_s": 75.9},
              {"index": 3, "kind": "driver_kill", "target": "driver", "injected_s": 109.7, "ended_s": 114.2}]
    commits = [50.0 + t / 3 for t in range(60)] + [106.0 + t / 3 for t in range(10)]  # 3 steps a second
    cut = throughput_back(faults[0], commits, faults)
    assert cut["all_healed_s"] == 75.9 and cut["back_s"] is not None and cut["back_s"] < 120
    assert check_throughput([cut]).ok is True
    # a fault far enough after the heal is judged alone: rate back in the gap, or never
    spaced = throughput_back(faults[1], commits, faults)
    assert spaced["all_healed_s"] == 75.9
