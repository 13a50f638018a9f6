"""The straggler timeout of a role: the setting, or derived from the seconds per sample measured on finished work
(services/streams/stragglers.py). Pure: no Redis."""

from __future__ import annotations

import pytest

from pcl.config import load_config
from services.streams.stragglers import STRAGGLER_FACTOR, STRAGGLER_MIN_S, StragglerTimeout


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
