"""The chaos run's fault schedule (`pcl.tools.chaos_schedule`): a pure function of the seed that meets the rules
(count, kinds, faults close together, the control actions), and the phase a moment of the run is in."""

from __future__ import annotations

import pytest

from pcl.tools.chaos_schedule import (CLOSE_S, KINDS, LEAD_S, MIN_FAULTS, MIN_KINDS, Fault, Observation, Schedule,
                                      check_schedule, draw_schedule, format_schedule, phase_of)


@pytest.mark.parametrize("seed", range(20))
def test_the_full_schedule_meets_the_rules_for_every_seed(seed):
    schedule = draw_schedule(seed, MIN_FAULTS, window_s=540.0)
    assert check_schedule(schedule, MIN_FAULTS) == []
    assert len(schedule.kinds) == len(KINDS) >= MIN_KINDS  # 12 faults: every kind, one twice
    gaps = [b.at_s - a.at_s for a, b in zip(schedule.faults, schedule.faults[1:])]
    assert sum(g <= CLOSE_S[1] for g in gaps) >= MIN_FAULTS // 3 - 1  # about a third within seconds of another
    assert all(LEAD_S <= f.at_s <= 540.0 + MIN_FAULTS * CLOSE_S[1] for f in schedule.faults)
    assert all((f.hold_s > 0) == (f.kind == "redis_full") for f in schedule.faults)
    assert [f.index for f in schedule.faults] == list(range(MIN_FAULTS))


def test_the_schedule_is_a_function_of_the_seed():
    a, b = draw_schedule(7, 12, 300.0), draw_schedule(7, 12, 300.0)
    assert a == b and a.to_json() == b.to_json()
    assert Schedule.from_json(a.to_json()) == a  # what schedule.json holds replays the same run
    assert draw_schedule(8, 12, 300.0) != a


@pytest.mark.parametrize("count", [1, 2, 3, 5, 7])
def test_a_short_schedule_draws_distinct_kinds(count):
    schedule = draw_schedule(1, count, window_s=60.0)
    assert len(schedule.kinds) == count
    assert check_schedule(schedule, count, min_kinds=count) == []


def test_kinds_can_be_narrowed_and_bad_requests_are_refused():
    schedule = draw_schedule(0, 6, 60.0, kinds=("kill_rollout", "malformed"))
    assert set(schedule.kinds) == {"kill_rollout", "malformed"}
    with pytest.raises(ValueError, match="unknown fault kinds"):
        draw_schedule(0, 3, 60.0, kinds=("kill_everything",))
    with pytest.raises(ValueError):
        draw_schedule(0, 0, 60.0)


def test_check_schedule_names_what_breaks_the_rules():
    faults = tuple(Fault(i, "kill_rollout", 10.0 + 20 * i) for i in range(12))
    problems = check_schedule(Schedule(0, 300.0, faults, ()), 12)
    assert any("1 kinds" in p for p in problems)
    assert any("within" in p for p in problems)
    assert any("control actions" in p for p in problems)
    assert any("13 faults" in p or "not 13" in p for p in check_schedule(Schedule(0, 300.0, faults, ()), 13))


def test_the_printed_schedule_names_each_fault_and_action():
    schedule = draw_schedule(3, 12, 400.0)
    text = format_schedule(schedule)
    assert "seed 3" in text and all(f"#{f.index}" in text for f in schedule.faults)
    assert "at the next weight-sync after" in text and "control pause" in text and "control tau" in text


@pytest.mark.parametrize("obs, phase", [
    (Observation(driver="down"), "driver-down"),
    (Observation(driver="restarting", checkpoint_writing=True), "restart"),
    (Observation(driver="up", checkpoint_writing=True, titles=("ray::LearnerRank.train_step",)), "checkpoint-write"),
    (Observation(driver="up", titles=("ray::LearnerRank.save_checkpoint",)), "checkpoint-write"),
    (Observation(driver="up", titles=("ray::RolloutWorker", "ray::LearnerRank.full_state_dict")), "weight-sync"),
    (Observation(driver="up", titles=("ray::RolloutWorker.load_weights",)), "weight-sync"),
    (Observation(driver="up", titles=("ray::LearnerRank.train_step", "ray::Coordinator.run")), "train"),
    (Observation(driver="up", paused=True, titles=("ray::Coordinator.run",)), "paused"),
    (Observation(driver="up", titles=("ray::Coordinator.run", "ray::RolloutWorker")), "rollout"),
    (Observation(driver="ending"), "ending"),
])
def test_the_phase_of_a_moment(obs, phase):
    assert phase_of(obs) == phase
