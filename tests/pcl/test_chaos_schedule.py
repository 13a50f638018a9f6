"""The chaos run's fault schedule (`pcl.tools.chaos_schedule`): a pure function of the seed that meets the rules
(count, kinds, faults close together, the control actions), and the phase a moment of the run is in."""

from __future__ import annotations

import pytest

from pcl.tools.chaos_schedule import (CLOSE_S, HOLD_S, KINDS, LEAD_S, MIN_FAULTS, MIN_KINDS, WINDOW_SHARE, Fault,
                                      Observation, Schedule, check_schedule, draw_schedule, fit_window,
                                      format_schedule, phase_of, seconds_per_step)


@pytest.mark.parametrize("seed", range(20))
def test_the_full_schedule_meets_the_rules_for_every_seed(seed):
    schedule = draw_schedule(seed, MIN_FAULTS, window_s=540.0)
    assert check_schedule(schedule, MIN_FAULTS) == []
    assert len(schedule.kinds) == len(KINDS) >= MIN_KINDS  # 12 faults: every kind once, a freeze on every seed
    assert "freeze" in schedule.kinds
    gaps = [b.at_s - a.at_s for a, b in zip(schedule.faults, schedule.faults[1:])]
    assert sum(g <= CLOSE_S[1] for g in gaps) >= MIN_FAULTS // 3 - 1  # about a third within seconds of another
    assert all(LEAD_S <= f.at_s <= 540.0 + MIN_FAULTS * CLOSE_S[1] for f in schedule.faults)
    assert all((f.hold_s > 0) == (f.kind in HOLD_S) for f in schedule.faults)
    assert all(HOLD_S[f.kind][0] <= f.hold_s <= HOLD_S[f.kind][1] for f in schedule.faults if f.kind in HOLD_S)
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


def test_the_window_fits_the_run():
    """Seed 1's 12 faults over the old default (40 s a fault: 480 s) outlasted its 150 steps (about 430 s): the
    window is now a share of the run's expected length, so every fault is drawn while the run trains."""
    window = fit_window(steps=150, step_s=2.0)
    assert window == WINDOW_SHARE * 300 < 300
    schedule = draw_schedule(1, 12, window)
    assert max(f.at_s for f in schedule.faults) < 150 * 2.0  # clustered faults may pass the window by seconds
    assert max(a.at_s for a in schedule.actions) < 150 * 2.0
    assert fit_window(steps=2, step_s=1.0) == 2 * LEAD_S  # never shorter than the lead before the first fault
    with pytest.raises(ValueError):
        fit_window(steps=0, step_s=2.0)


def test_a_runs_pace_from_its_records():
    lines = [{"step": 0, "eval_accuracy": 0.5, "elapsed_seconds": 1.0}]  # an evaluation line is no step
    lines += [{"step": s, "effective_ratio": 0.5, "elapsed_seconds": 10.0 + 2.5 * s} for s in range(1, 9)]
    assert seconds_per_step(lines) == pytest.approx(2.5)
    assert seconds_per_step(lines[:2]) is None and seconds_per_step([]) is None
