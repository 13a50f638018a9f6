"""A sick reward worker is replaced, workers are recycled, and their errors are never silent zeros.

The pool is the real spawn-based RewardPool; samples other than the injected failures are scored by the real
math-verify. `sick_score` models what a worker at its memory cap does: after it falls sick ("leak"), every
sample it is given raises MemoryError, on that worker only.
"""

from __future__ import annotations

import pytest

from pcl.reward.pool import RewardPool, math_score

_SICK = False  # per worker process: set once the worker has "leaked"
HALF = r"so \boxed{\frac{1}{2}}"  # not a plain number: scored by math-verify in a worker


def sick_score(response, golds):
    global _SICK
    if response == "leak":
        _SICK = True
        return 0.0
    if _SICK or response == "always-oom":
        raise MemoryError("cannot allocate memory")
    return math_score(response, golds)


def test_a_worker_that_returns_an_error_is_replaced_and_the_sample_scored_again():
    with RewardPool(processes=1, timeout_s=30.0, score_fn=sick_score) as pool:
        assert pool.wait_ready(120)
        before = pool.worker_pids()
        outcomes = pool.score_batch([("leak", 1), (HALF, "0.5"), (HALF, "0.5"), ("always-oom", 1), (HALF, "0.5")])
        # Correct answers score 1 even though the worker that got them first had fallen sick ...
        assert [o.reward for o in outcomes] == [0.0, 1.0, 1.0, 0.0, 1.0], outcomes
        assert [o.error for o in outcomes[:3]] == [None, None, None]
        # ... while a sample that fails on a fresh worker too is an error, reported as one.
        assert outcomes[3].error.startswith("MemoryError") and not outcomes[3].timed_out
        assert outcomes[4].error is None
        assert pool.worker_pids() != before
        stats = pool.stats()
        assert stats["replaced_after_error"] == 3, stats  # the sick worker, then "always-oom" on two workers
        assert stats["errors"] == 1, stats


def test_workers_are_recycled_after_max_tasks_per_worker():
    with RewardPool(processes=1, timeout_s=30.0, max_tasks_per_worker=3) as pool:
        assert pool.wait_ready(120)
        first = pool.worker_pids()
        outcomes = pool.score_batch([(HALF, "0.5")] * 7)
        assert [o.reward for o in outcomes] == [1.0] * 7
        assert pool.stats()["recycled"] == 2  # after the 3rd and the 6th sample
        assert pool.worker_pids() != first
    with pytest.raises(ValueError, match="max_tasks_per_worker"):
        RewardPool(processes=1, max_tasks_per_worker=0)
