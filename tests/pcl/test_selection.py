"""select_closest: hand-computed picks, tie-breaking, optimality against brute force, and input errors."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcl.strategies.selection import select_closest

torch.set_num_threads(1)


def test_picks_closest_to_tau_in_order_of_distance():
    # |V - 0.5| = [0.4, 0.05, 0.3, 0.0, 0.25] -> order 3, 1, 4, 2, 0
    values = [0.1, 0.55, 0.8, 0.5, 0.25]
    assert select_closest(values, 3, 0.5).tolist() == [3, 1, 4]
    assert select_closest(values, 5, 0.5).tolist() == [3, 1, 4, 2, 0]


def test_ties_go_to_the_lower_index():
    # |V - 0.5| = [0.25, 0.25, 0.25, 0.5, 0.25]: four-way tie, lowest indices win
    values = [0.25, 0.75, 0.25, 1.0, 0.75]
    assert select_closest(values, 2, 0.5).tolist() == [0, 1]
    assert select_closest(values, 4, 0.5).tolist() == [0, 1, 2, 4]


def test_other_tau_and_endpoints():
    # tau = 0.2: |V - 0.2| = [0.2, 0.8, 0.1, 0.05] -> 3, 2, 0, 1
    assert select_closest(np.array([0.0, 1.0, 0.3, 0.15]), 2, 0.2).tolist() == [3, 2]
    # tau = 1: the most solvable prompts; tau = 0: the least
    assert select_closest([0.2, 0.9, 1.0], 1, 1.0).tolist() == [2]
    assert select_closest([0.2, 0.9, 0.0], 1, 0).tolist() == [2]


def test_accepts_torch_with_grad_and_returns_int64():
    values = torch.tensor([0.9, 0.45, 0.6], requires_grad=True)
    idx = select_closest(values, 2, 0.5)
    # float32 0.45 and 0.6 are not exact: |0.45 - 0.5| ~ 0.05 < |0.6 - 0.5| ~ 0.1
    assert idx.dtype == np.int64 and idx.tolist() == [1, 2]


def test_m_zero_and_empty_pool():
    assert select_closest([0.3, 0.7], 0, 0.5).tolist() == []
    assert select_closest([], 0, 0.5).shape == (0,)


@pytest.mark.parametrize(
    "values, m, tau, name",
    [
        ([0.1, 0.2], 3, 0.5, "m"),
        ([0.1, 0.2], -1, 0.5, "m"),
        ([0.1, 0.2], 1.5, 0.5, "m"),
        ([0.1, 0.2], 1, 1.5, "tau"),
        ([0.1, 0.2], 1, -0.1, "tau"),
        ([0.1, 0.2], 1, float("nan"), "tau"),
        ([0.1, float("nan")], 1, 0.5, "values"),
        ([[0.1, 0.2]], 1, 0.5, "values"),
        (torch.zeros(2, 2), 1, 0.5, "values"),
        ([0.1, 1.2], 1, 0.5, "values"),
        ([0.1, -0.01], 1, 0.5, "values"),
        (["a", "b"], 1, 0.5, "values"),
    ],
)
def test_bad_input_names_the_argument(values, m, tau, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        select_closest(values, m, tau)


# Drawing from a coarse grid makes ties frequent, so the tie rule is exercised, not just the sort.
score = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), st.floats(0.0, 1.0))


@settings(max_examples=100, deadline=None)
@given(values=st.lists(score, min_size=1, max_size=9), data=st.data())
def test_selection_is_optimal_and_breaks_ties_low(values, data):
    m = data.draw(st.integers(0, len(values)), label="m")
    tau = data.draw(st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.floats(0.0, 1.0)), label="tau")
    idx = select_closest(values, m, tau).tolist()
    dist = [abs(v - tau) for v in values]

    assert len(idx) == m and len(set(idx)) == m
    # Minimal total distance over every m-subset (brute force).
    best = min(sum(dist[i] for i in combo) for combo in itertools.combinations(range(len(values)), m))
    assert sum(dist[i] for i in idx) == pytest.approx(best, abs=1e-12)
    # Ordered by (distance, index), and every left-out candidate is farther, or as far with a higher index.
    assert idx == sorted(idx, key=lambda i: (dist[i], i))
    chosen = set(idx)
    for i in chosen:
        for j in set(range(len(values))) - chosen:
            assert (dist[i], i) < (dist[j], j)
