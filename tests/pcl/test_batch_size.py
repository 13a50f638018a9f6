"""find_knee: where generation time per sample stops falling, on hand-computed curves, and its input errors."""

import math

import pytest

from pcl.tools.batch_size import find_knee, growth_exponents


def test_knee_of_a_flat_then_linear_curve():
    # per sample (ms): 4.69, 2.50, 1.56, 1.46, 1.46 -> 256 is within 10% of the best still to come (1.46)
    knee = find_knee([64, 128, 256, 512, 1024], [0.30, 0.32, 0.40, 0.75, 1.50])
    assert (knee.batch_size, knee.index, knee.found) == (256, 2, True)
    assert knee.exponents[-1] == pytest.approx(1.0) and knee.exponents[0] == pytest.approx(math.log2(0.32 / 0.30))


def test_knee_measured_on_the_tiny_fleet():
    # `pcl probe-batch configs/tiny.yaml` on a 2-core machine: sublinear to 2048, then linear
    sizes = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    seconds = [0.089, 0.166, 0.267, 0.452, 0.747, 1.351, 3.060, 5.935]
    assert find_knee(sizes, seconds).batch_size == 2048


def test_linear_from_the_start_and_never_linear():
    assert find_knee([8, 16, 32], [1.0, 2.0, 4.0]).batch_size == 8  # no batching gain at all: smallest
    still_falling = find_knee([8, 16, 32], [1.0, 1.1, 1.2])
    assert still_falling.batch_size == 32 and not still_falling.found  # the knee may lie beyond


def test_growth_exponents_are_log_ratios():
    assert growth_exponents([1, 2, 4], [1.0, 2.0, 2.0]) == pytest.approx([1.0, 0.0])


@pytest.mark.parametrize("sizes, seconds, name", [
    ([64], [1.0], "sizes and seconds"),
    ([64, 128], [1.0], "sizes and seconds"),
    ([128, 64], [1.0, 2.0], "sizes"),
    ([0, 64], [1.0, 2.0], "sizes"),
    ([64, 128], [1.0, 0.0], "seconds"),
    ([64, 128], [1.0, float("nan")], "seconds"),
])
def test_bad_input_names_the_argument(sizes, seconds, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        find_knee(sizes, seconds)
