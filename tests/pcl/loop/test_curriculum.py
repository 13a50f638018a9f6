"""The curriculum's figures (`pcl.loop.curriculum`) against values computed by hand."""

from __future__ import annotations

import pytest

from pcl.loop.curriculum import (
    ReliabilityRow, band_width, brier_score, calibration_error, expected_effective_ratio, pool_histogram,
    realized_effective_ratio, reliability_table,
)

PREDICTED = [0.05, 0.15, 0.45, 0.48, 0.9]
REALIZED = [0.0, 0.25, 0.5, 0.25, 1.0]


def test_the_reliability_table_bins_by_v_and_means_each_bin():
    rows = reliability_table(PREDICTED, REALIZED, bins=10)
    assert len(rows) == 10 and sum(r.count for r in rows) == 5
    filled = {r.label: (r.predicted, r.realized, r.count) for r in rows if r.count}
    assert filled.keys() == {"0-0.1", "0.1-0.2", "0.4-0.5", "0.9-1"}
    assert filled["0-0.1"] == (0.05, 0.0, 1) and filled["0.1-0.2"] == (0.15, 0.25, 1)
    assert filled["0.4-0.5"] == (pytest.approx(0.465), pytest.approx(0.375), 2)  # (0.45 + 0.48) / 2, (0.5 + 0.25) / 2
    assert filled["0.9-1"] == (0.9, 1.0, 1)
    assert rows[5] == ReliabilityRow(0.5, 0.6, None, None, 0)  # empty bins stay, with no means


def test_a_value_of_one_falls_in_the_last_bin():
    assert [r.count for r in reliability_table([1.0, 0.0], [1.0, 0.0], bins=4)] == [1, 0, 0, 1]


def test_the_expected_calibration_error_weights_each_bin_by_its_prompts():
    # |0.05 - 0| + |0.15 - 0.25| + 2 |0.465 - 0.375| + |0.9 - 1| over 5 prompts: (0.05 + 0.1 + 0.18 + 0.1) / 5
    assert calibration_error(reliability_table(PREDICTED, REALIZED)) == pytest.approx(0.086)
    assert calibration_error(reliability_table([0.3, 0.7], [0.3, 0.7])) == 0.0
    assert calibration_error(reliability_table([], [])) is None


def test_the_brier_score_is_the_mean_squared_error():
    # (0.05^2 + 0.1^2 + 0.05^2 + 0.23^2 + 0.1^2) / 5 = 0.0779 / 5
    assert brier_score(PREDICTED, REALIZED) == pytest.approx(0.01558)
    assert brier_score([], []) is None


def test_a_perfect_v_still_scores_the_sampling_noise_of_n_responses():
    # q = 0.5, n = 2: p is 0, 0.5, 0.5, 1 equally often; E (q - p)^2 = q (1 - q) / n = 0.125
    assert brier_score([0.5] * 4, [0.0, 0.5, 0.5, 1.0]) == pytest.approx(0.125)


def test_the_pool_histogram_counts_the_candidates_by_bin():
    assert pool_histogram([0.0, 0.05, 0.5, 0.55, 1.0], bins=4) == [2, 0, 2, 1]
    assert pool_histogram([], bins=3) == [0, 0, 0]


def test_the_band_is_the_farthest_selected_prediction_from_tau():
    assert band_width([0.4, 0.55, 0.62], 0.5) == pytest.approx(0.12)
    assert band_width([0.2], 0.3) == pytest.approx(0.1) and band_width([], 0.5) is None


def test_the_realized_effective_ratio_is_the_share_of_mixed_groups():
    assert realized_effective_ratio([0.0, 0.25, 1.0, 0.5]) == 0.5
    assert realized_effective_ratio([1.0, 1.0]) == 0.0 and realized_effective_ratio([]) is None


def test_the_expected_effective_ratio_is_the_chance_of_a_mixed_group():
    assert expected_effective_ratio([0.5], n=8) == pytest.approx(1 - 2 / 256)  # 1 - 0.5^8 - 0.5^8
    assert expected_effective_ratio([0.5, 0.0, 1.0], n=2) == pytest.approx(0.5 / 3)  # (1 - 0.25 - 0.25 + 0 + 0) / 3
    assert expected_effective_ratio([], n=4) is None


@pytest.mark.parametrize("call, message", [
    (lambda: brier_score([0.5, 0.5], [0.5]), "differ in length"),
    (lambda: brier_score([float("nan")], [0.5]), "predicted: every value must be a finite number"),
    (lambda: pool_histogram([0.5], bins=0), "bins must be at least 1"),
    (lambda: expected_effective_ratio([0.5], n=0), "n must be at least 1"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
