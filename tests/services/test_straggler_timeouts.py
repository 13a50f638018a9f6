"""The straggler timeout of a role: the setting, or derived from the seconds per sample measured on finished work,
and which workers it makes stragglers or stuck (services/streams/stragglers.py)."""

from __future__ import annotations

import pytest

from pcl.config import load_config
from services.streams.stragglers import (STRAGGLER_FACTOR, STRAGGLER_MIN_S, StragglerTimeout, StragglerWatch,
                                         WorkerState)


def test_a_set_timeout_is_used_as_it_is():
    timeout = StragglerTimeout(2.5, 30.0)
    assert timeout.for_samples(0) == timeout.for_samples(10_000) == 2.5


def test_a_derived_timeout_waits_for_a_measured_rate_then_scales_with_the_samples_held():
    timeout = StragglerTimeout(None, None)
    assert timeout.for_samples(64) is None  # nothing measured: no handover (the visibility timeout still acts)
    assert timeout.for_samples(0) == STRAGGLER_MIN_S  # a silent worker holding nothing: the floor
    timeout.observe(64, 32.0)  # 0.5 s a sample
    assert timeout.for_samples(4) == STRAGGLER_MIN_S  # 3 x 2 s is below the floor
    assert timeout.for_samples(100) == pytest.approx(STRAGGLER_FACTOR * 100 * 0.5)
    for _ in range(8):  # the window follows the recent rate: responses got longer
        timeout.observe(10, 10.0)
    assert timeout.seconds_per_sample == pytest.approx(1.0)


def test_a_worker_is_restarted_only_after_its_work_was_handed_over():
    with pytest.raises(Exception, match="stuck_timeout_s .* must exceed straggler_timeout_s"):
        load_config(None, ["rollout.straggler_timeout_s=60", "rollout.stuck_timeout_s=30"])
    with pytest.raises(Exception, match="stuck_timeout_s .* must exceed straggler_timeout_s"):
        load_config(None, ["verifier.straggler_timeout_s=200"])  # the default stuck timeout is 120 s
    cfg = load_config(None, [])
    assert cfg.rollout.straggler_timeout_s is None and cfg.rollout.stuck_timeout_s == 300.0
    assert cfg.verifier.straggler_timeout_s is None and cfg.verifier.stuck_timeout_s == 120.0


@pytest.mark.redis
def test_a_worker_is_stuck_only_past_both_its_stuck_and_its_straggler_timeout(redis_client, key_prefix):
    """A long healthy engine call (its straggler timeout, derived from the measured rate, is longer than the stuck
    timeout) is never restarted; a silent worker, or one past both, is."""
    cfg = load_config(None, [f"run.name={key_prefix}", "rollout.stuck_timeout_s=25", "verifier.stuck_timeout_s=25"])
    watch = StragglerWatch(cfg, redis_client)
    watch.timeouts["rollout"].observe(100, 50.0)  # 0.5 s a sample: a call on 64 samples may take 96 s
    watch.states = {"rollout-0": WorkerState("rollout-0", "a", "", 40.0, 40.0, 64, 40.0),  # healthy, long
                    "rollout-1": WorkerState("rollout-1", "b", "", 0.0, 0.0, 0, 30.0),  # silent for 30 s
                    "rollout-2": WorkerState("rollout-2", "c", "", 100.0, 100.0, 64, 100.0),  # past both
                    "verifier-0": WorkerState("verifier-0", "d", "", 3.0, 3.0, 8, 3.0)}
    assert [s.instance for s in watch.stuck()] == ["rollout-1", "rollout-2"]
    assert watch.straggling("rollout") == {"rollout-1", "rollout-2"}
    assert watch.straggling("verifier") == set()
