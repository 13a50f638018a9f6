"""The partition invariants (pcl/tools/partition_checks.py), fed by hand: each fails when fed nothing, and on the
one thing it checks."""

from __future__ import annotations

from pcl.config import load_config
from pcl.tools.partition_checks import (check_freezes, check_incarnations, check_stale_results, expected_instances,
                                        overlaps, stale_by_node)


def incarnation(instance: str, incarnation: str, first_ms: int, last_ms: int, host: str = "h") -> dict:
    return {"role": instance.split("-")[0], "instance": instance, "incarnation": incarnation, "node": "n",
            "host": host, "pid": 1, "first_ms": first_ms, "last_ms": last_ms, "ended_ms": None}


def test_the_chaos_runs_instances_are_every_actor_its_config_starts():
    cfg = load_config(["configs/chaos.yaml"], [])
    assert expected_instances(cfg) == {"coordinator", "sampler", "learner-0", "learner-1", "rollout-0", "rollout-1",
                                       "verifier-0", "verifier-1", "scorer-0"}
    uniform = load_config(["configs/chaos.yaml"], ["selection.type=uniform"])
    assert "scorer-0" not in expected_instances(uniform)  # no V: no scorer


def test_no_heartbeat_at_all_fails():
    check = check_incarnations([], {"coordinator"})
    assert check.ok is False and "nothing to check" in check.detail


def test_an_instance_that_never_beat_fails():
    check = check_incarnations([incarnation("coordinator", "c1", 0, 10)], {"coordinator", "sampler"})
    assert check.ok is False and "no heartbeat from sampler" in check.detail


def test_restarts_that_hand_over_pass_and_overlapping_incarnations_fail():
    handover = [incarnation("rollout-0", "a", 0, 5_000), incarnation("rollout-0", "b", 5_001, 9_000),
                incarnation("rollout-0", "c", 9_500, 12_000), incarnation("coordinator", "x", 0, 12_000)]
    check = check_incarnations(handover, {"rollout-0", "coordinator"})
    assert check.ok, check.detail
    assert "4 incarnations of 2 instances (coordinator 1, rollout-0 3)" in check.detail
    # the first process of rollout-0 beats again after the second one started: both alive for 2 s
    zombie = handover + [incarnation("rollout-0", "a", 0, 7_001, host="cut-off")]
    zombie = [e for e in zombie if not (e["incarnation"] == "a" and e["last_ms"] == 5_000)]
    assert [(a["incarnation"], b["incarnation"]) for a, b in overlaps(zombie)] == [("a", "b")]
    check = check_incarnations(zombie, {"rollout-0", "coordinator"})
    assert check.ok is False and "rollout-0: two live incarnations for 2.0 s, a on cut-off" in check.detail


def test_beats_within_one_millisecond_of_a_handover_are_no_overlap():
    """The server's clock counts milliseconds: a last beat and the next process's first in the same one are a
    handover (a new process is up seconds after the old one's death, never within the millisecond)."""
    assert not overlaps([incarnation("learner-0", "a", 0, 5_000), incarnation("learner-0", "b", 5_000, 6_000)])


def step(s: int, stale: dict | None) -> dict:
    line = {"step": s, "effective_ratio": 0.5}
    if stale is not None:
        line["dropped_stale_by_producer"] = stale
    return line


def test_stale_results_are_reported_by_the_node_of_the_incarnation_that_produced_them():
    registry = [incarnation("rollout-1", "aa", 0, 9, host="node-a"), incarnation("rollout-1", "bb", 10, 20, "node-b")]
    lines = [step(1, {}), step(2, {"rollout-1@aa": 3}), step(3, {"rollout-1@aa": 3, "rollout-1@bb": 1}),
             {"step": 3, "eval_accuracy": 0.5}]
    check = check_stale_results(lines, registry)
    assert check.ok, check.detail
    assert check.detail == ("4 results dropped as stale: by node node-a 3, node-b 1; by producer rollout-1@aa 3, "
                            "rollout-1@bb 1")
    assert stale_by_node({"rollout-1@gone": 2, "?@?": 1}, registry) == {"?": 3}  # no such incarnation: unknown


def test_stale_results_fail_without_records_unrecorded_or_a_count_that_went_back():
    assert check_stale_results([], []).ok is False
    unrecorded = check_stale_results([step(1, {}), step(2, None)], [])
    assert unrecorded.ok is False and "steps 2" in unrecorded.detail
    back = check_stale_results([step(1, {"rollout-0@aa": 2}), step(2, {"rollout-0@aa": 1})], [])
    assert back.ok is False and "step 2: the count went back for rollout-0@aa" in back.detail


def freeze(index: int, at: float, held: float) -> dict:
    return {"index": index, "kind": "freeze", "injected_s": at, "ended_s": at + held, "recovered_s": 0.5}


def test_a_long_freeze_passes_only_when_the_run_trained_on_while_the_worker_was_stopped():
    commits = [("commit", t, i) for i, t in enumerate([10.0, 12.0, 31.0, 33.0, 80.0], start=1)]
    check = check_freezes([freeze(0, 14.0, 30.0), freeze(1, 50.0, 4.0)], commits)  # steps at 31 and 33: 15 s in
    assert check.ok, check.detail
    assert "2 freezes: 1 held 20 s or longer with the run training on (2 steps from 15 s in), 1 shorter" in check.detail
    stalled = check_freezes([freeze(2, 40.0, 35.0)], commits)  # nothing committed from 55 s to 75 s
    assert stalled.ok is False and "#2 at 40.0 s, held 35.0 s" in stalled.detail


def test_a_stalled_freeze_that_another_fault_or_a_restart_overlaps_is_excused_and_nothing_fails():
    commits = [("commit", 10.0, 1), ("commit", 90.0, 2)]
    killed = {"index": 1, "kind": "kill_learner", "injected_s": 45.0, "ended_s": 45.0, "recovered_s": 40.0}
    assert check_freezes([freeze(0, 40.0, 30.0), killed], commits).ok
    assert check_freezes([freeze(0, 40.0, 30.0)], commits + [("restored", 60.0, 0)]).ok
    assert check_freezes([], commits).ok is False  # fed nothing: fails
