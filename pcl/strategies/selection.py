"""Prompt selection by predicted pass rate: the greedy choice of PCL (algorithm step 3).

Each step the value model scores k*m candidate prompts with a predicted pass rate V(x) in [0, 1];
PCL trains on the m candidates whose V(x) is closest to the target tau, because prompts solved about
half the time give the largest share of samples with a non-zero advantage. The selection strategies
and the coordinator call `select_closest` with the scores and use the returned indices to pick prompts:

    idx = select_closest(scores, m=512, tau=0.5)   # scores: k*m values, idx: m int64 indices
    chosen = [candidates[i] for i in idx]
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np


def _as_float64_vector(values: Any) -> np.ndarray:
    """Return `values` (list, numpy array or torch tensor) as a 1-D float64 numpy array, or raise."""
    if hasattr(values, "detach"):  # a torch tensor: leave autograd and the device behind
        values = values.detach().to("cpu").double().numpy()
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"values: expected numbers in [0, 1], could not convert ({exc})") from None
    if array.ndim != 1:
        raise ValueError(f"values: expected a 1-D sequence of scores, got shape {tuple(array.shape)}")
    if np.isnan(array).any():
        bad = int(np.flatnonzero(np.isnan(array))[0])
        raise ValueError(f"values: NaN score at candidate index {bad}")
    outside = (array < 0.0) | (array > 1.0)
    if outside.any():
        bad = int(np.flatnonzero(outside)[0])
        raise ValueError(f"values: score {array[bad]!r} at candidate index {bad} is outside [0, 1]")
    return array


def select_closest(values: Any, m: int, tau: float) -> np.ndarray:
    """Indices of the m candidates whose predicted pass rate is closest to `tau` (algorithm step 3).

    Args:
        values: shape [k*m], predicted pass rate V(x) of each candidate prompt, each in [0, 1]
            (list, numpy array or torch tensor on any device).
        m: how many candidates to keep, 0 <= m <= len(values).
        tau: target pass rate in [0, 1].

    Returns:
        int64 array of shape [m]: distinct candidate indices in ascending order of |V - tau|, ties
        broken toward the lower candidate index, so the result is deterministic and minimises
        sum |V - tau| over all m-subsets.

    Raises:
        ValueError: naming the argument, for a non-1-D or non-numeric `values`, a NaN or a score
            outside [0, 1], `m` not an integer in [0, len(values)], or `tau` outside [0, 1].
    """
    scores = _as_float64_vector(values)
    try:
        m = operator.index(m)
    except TypeError:
        raise ValueError(f"m: expected an integer, got {m!r}") from None
    if not 0 <= m <= scores.shape[0]:
        raise ValueError(f"m: must be between 0 and the number of candidates ({scores.shape[0]}), got {m}")
    if isinstance(tau, bool) or not isinstance(tau, (int, float, np.floating, np.integer)):
        raise ValueError(f"tau: expected a number in [0, 1], got {tau!r}")
    if not 0.0 <= float(tau) <= 1.0:  # also rejects NaN
        raise ValueError(f"tau: must be in [0, 1], got {tau!r}")
    distance = np.abs(scores - float(tau))
    # A stable sort keeps equal distances in candidate order: ties go to the lower index.
    order = np.argsort(distance, kind="stable")
    return order[:m].astype(np.int64, copy=False)
