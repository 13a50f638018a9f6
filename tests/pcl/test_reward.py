r"""The math reward and its pool: pinned verdicts, hostile model outputs, crashes, and agreement with the
gold answer of every record of the six shipped evaluation sets (real math-verify, real processes)."""

from __future__ import annotations

import doctest
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pcl.reward.verdict
from bench.reward_agreement import (
    CONSTANT_WRONG, load_golds, math_verify_verdict, multi_answer_golds, response_with, several_answer_pairs,
    wrong_answer,
)
from pcl.reward.verdict import (
    _parse_gold, _several_answers, last_boxed, math_reward, normalize_gold, numbers_match, numbers_verdict,
    plain_number, score_answer,
)
from pcl.reward.pool import RewardPool

DATA_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "math"
TIMEOUT_S = 1.0


def test_doctests_pass():
    assert doctest.testmod(pcl.reward.verdict).failed == 0


@pytest.mark.parametrize(
    ("response", "gold", "reward"),
    [
        (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"so \boxed{27}", 27.0, 1.0),  # AMC golds are floats
        (r"so \boxed{27.0}", 27.0, 1.0),
        (r"so \boxed{26}", 27.0, 0.0),
        (r"\boxed{\frac14}", 0.25, 1.0),
        (r"\boxed{2n}", ["$2n$"], 1.0),  # OlympiadBench: a list with LaTeX in dollars
        (r"\boxed{x}", ["3", "x"], 1.0),  # any alternative counts
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0),  # nested braces, equal values
        (r"\boxed{3}, no wait, \boxed{4}", "4", 1.0),  # the last box wins
        (r"\boxed{3}, no wait, \boxed{4}", "3", 0.0),
        (r"\boxed{3} and then \boxed{4", "3", 1.0),  # an unclosed (truncated) box is not an answer
        (r"\fbox{7}", "7", 1.0),
        (r"\boxed{x=\boxed{5}}", "5", 1.0),
        (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),  # escaped braces do not close the box
        (r"\boxed{(3, \pi/2)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
        (r"\boxed{Evelyn}", r"\text{Evelyn}", 1.0),
        (r"\boxed{10,\!080}", "10080", 1.0),
        (r"\boxed{8.2 \times 10^{-19}}", "8.2e-19", 1.0),
        (r"\boxed{9.2 \times 10^{-19}}", r"8.2 \times 10^{-19}", 0.0),  # math-verify alone says 1
        (r"\boxed{-3}", "3", 0.0),
        ("The final answer is $\\frac{1}{2}$.", "1/2", 1.0),  # no box: math-verify's own extraction
        ("The answer is 42", "42", 1.0),
        ("I do not know", "42", 0.0),
        (r"\boxed{}", "1", 0.0),
        # A gold of several answers: each answer boxed on its own counts, as math-verify counts it.
        (r"\boxed{1}, \boxed{2}", "1, 2", 1.0),
        (r"so $\boxed{2}$ and $\boxed{1}$.", ["1,2"], 1.0),
        (r"\boxed{(1, 2)} \text{ and } \boxed{(2, 1)}", ["$(1,2),(2,1)$"], 1.0),
        (r"\boxed{f(x)=x}, \boxed{f(x)=2-x}", ["$f(x)=x$,$f(x)=2-x$"], 1.0),
        (r"\boxed{1}, \boxed{2}, \boxed{3}", "1, 2", 0.0),  # an extra answer
        (r"\boxed{1}", "1, 2", 0.0),  # a missing one
    ],
)
def test_math_reward_pins(response, gold, reward):
    assert math_reward(response, gold) == reward


def test_last_boxed_brace_matching():
    assert last_boxed(r"a \boxed{\frac{1}{\sqrt{2}}} b") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed(r"\boxed {1} \fbox{2}") == "2"
    assert last_boxed(r"\boxed{\}} \boxed{x}") == "x"
    assert last_boxed(r"\\{ \boxed{y} }") == "y"  # a LaTeX line break before a real brace
    assert last_boxed("no box") is None and last_boxed(r"\boxed{" * 1000) is None


@pytest.mark.parametrize(
    ("gold", "message"),
    [(None, "gold is None"), ("  ", "gold is empty"), ("$$", "gold is empty"), ([], "empty list"),
     (["1", None], r"gold\[1\] is None"), (float("nan"), "not a finite"), ((), "empty list")],
)
def test_bad_gold_raises_naming_it(gold, message):
    with pytest.raises(ValueError, match=message):
        math_reward(r"\boxed{1}", gold)


@pytest.mark.parametrize("gold", [True, object(), {"answer": 1}])
def test_gold_of_wrong_type_raises(gold):
    with pytest.raises(TypeError, match="gold must be"):
        normalize_gold(gold)


@pytest.mark.parametrize("response", [None, 123, b"\\boxed{1}", "}}}{{{", "\\boxed{\\frac{", "\\" * 50])
def test_odd_outputs_score_zero(response):
    assert math_reward(response, "1") == 0.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([*"\\{}^_$()[]=+-*/,.0123456789xyz", "\\boxed{", "\\frac{"]), max_size=40)
       .map("".join))
def test_any_text_scores_without_raising(text):
    assert math_reward(text, "12") in (0.0, 1.0)


_number = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.decimals(-1000, 1000, places=3, allow_nan=False, allow_infinity=False).map(str),
    st.sampled_from(["27", "27.0", "0.5", ".5", "0.50", "1,234", "1234", "-0", "0"]),
)


@settings(max_examples=80, deadline=None)
@given(_number, _number)
def test_numeric_fast_path_agrees_with_math_verify(answer, gold):
    from math_verify import parse, verify

    fast = numbers_match(plain_number(answer), plain_number(gold))
    slow = verify(parse(f"\\boxed{{{gold}}}", parsing_timeout=None),
                  parse(f"\\boxed{{{answer}}}", parsing_timeout=None), timeout_seconds=None)
    assert fast == slow, (answer, gold)


@settings(max_examples=80, deadline=None)
@given(_number, _number)
def test_a_response_that_is_only_a_number_is_scored_as_math_verify_reads_the_whole_text(answer, gold):
    from math_verify import parse, verify

    slow = verify(parse(f"\\boxed{{{gold}}}", parsing_timeout=None), parse(answer, parsing_timeout=None),
                  timeout_seconds=None)
    assert numbers_verdict(answer, (gold,)) == float(slow), (answer, gold)
    assert numbers_verdict(f"  {answer}\n", (gold,)) == float(slow), (answer, gold)


def test_responses_that_are_plain_numbers_never_reach_a_worker():
    """A model that answers with a bare number ("42") is scored in the calling thread: no IPC, no sympy."""
    with RewardPool(processes=1, timeout_s=30.0) as pool:
        pairs = [("42", "42"), (" 41\n", 42), ("1,234", "1234"), (r"so \boxed{7}", 7), ("x = 42", "42"), ("42", "x")]
        assert [o.reward for o in pool.score_batch(pairs)] == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
        assert pool.stats()["settled_in_caller"] == 4  # the last two need math-verify in a worker


def test_numbers_in_free_symbols_are_rejected_like_math_verify():
    from math_verify import parse, verify

    for gold in [r"\frac{e^{t}}{3} + c e^{-2t}", "2n+1", r"\text{Evelyn}"]:
        assert score_answer(r"\boxed{7}", (gold,), None) == 0.0
        assert not verify(parse(f"\\boxed{{{gold}}}"), parse(r"\boxed{7}"))
    assert score_answer(r"\boxed{5}", ("x = 5",), None) == 1.0  # an assignment is not a free expression


def test_several_answers_score_as_math_verify_scores_them():
    """On a gold of several answers the reward is math-verify's verdict, through the product's pool."""
    pairs = several_answer_pairs(multi_answer_golds(DATA_DIR))
    assert len(pairs) >= 6 * 80
    expected = [math_verify_verdict(response, gold) for response, gold in pairs]
    with RewardPool(processes=2, timeout_s=10.0) as pool:
        outcomes = pool.score_batch(pairs)
    misses = [(pair, want, got.reward) for pair, want, got in zip(pairs, expected, outcomes)
              if got.reward != want]
    # Only a gold that math-verify does not parse to a set keeps the last-box rule (OlympiadBench has one,
    # in prose: "f(x)=a x+b, where b is an arbitrary integer, ...").
    golds = {gold for (_, gold), _, _ in misses}
    assert not any(_several_answers(_parse_gold(normalize_gold(gold)[0], None)) for gold in golds), misses
    assert len(misses) <= 2, misses
    assert sum(expected) >= 2 * len(pairs) / 6  # the joined answers mostly score 1: the test can fail


@pytest.mark.parametrize(
    ("response", "gold", "reward"),
    [
        (r"\boxed{3}, no wait, \boxed{4}", "4", 1.0),  # math-verify joins the boxes: {3, 4}, not 4
        (r"\boxed{(1, 2)} \text{ and } \boxed{(2, 1)}", "(2, 1)", 1.0),
        (r"\boxed{1}, \boxed{3}", "(1, 3)", 0.0),  # one interval or pair: math-verify takes {1, 3} for it
    ],
)
def test_a_single_answer_gold_keeps_the_last_box_rule(response, gold, reward):
    assert math_reward(response, gold) == reward
    assert math_verify_verdict(response, gold) != reward  # where the rule departs from math-verify


# ----- the pool -----


def hostile_score(response, golds):
    """A score function with injected failures, imported by the spawned workers from this module."""
    if response == "exit":
        os._exit(3)
    if response == "sigkill":  # what the kernel's OOM killer does
        os.kill(os.getpid(), signal.SIGKILL)
    if response == "hang":
        time.sleep(600)
    if response == "oom":
        return len(bytearray(2**40))  # past the worker's address-space cap: MemoryError
    return score_answer(response, golds, None)


@pytest.fixture(scope="module")
def pool():
    with RewardPool(processes=2, timeout_s=TIMEOUT_S, score_fn=hostile_score) as reward_pool:
        assert reward_pool.wait_ready(60)
        yield reward_pool


def in_thread(function, *args):
    """Runs `function(*args)` on a non-main thread (where math-verify's alarm cannot work)."""
    results = []
    thread = threading.Thread(target=lambda: results.append(function(*args)))
    thread.start()
    thread.join(60)
    assert results, "the call did not return"
    return results[0]


def assert_reaped(pids):
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state != "Z", f"worker {pid} left as a zombie"
        pytest.fail(f"worker {pid} still running (state {state})")


HOSTILE = {
    "unclosed box bomb": "\\boxed{" * 100_000,
    "megabyte of arithmetic": "1+" * 2**19,
    "fractions 5000 deep": "\\boxed{" + "\\frac{" * 5000 + "1" + "}{2}" * 5000 + "}",
    "exponent tower": r"\boxed{10^{10^{10^{10}}}}",
    "power tower of nines": r"\boxed{9^{9^{9^{9^{9}}}}}",
    "factorial of a googol": r"\boxed{(10^{100})!}",
}


@pytest.mark.parametrize("names", [list(HOSTILE)[0:2], list(HOSTILE)[2:4], list(HOSTILE)[4:6]])
def test_hostile_outputs_score_zero_within_timeout_from_threads(pool, names):
    assert pool.wait_ready(60)
    pids = pool.worker_pids()
    start = time.monotonic()
    threads_results = {}
    threads = [threading.Thread(target=lambda n=n: threads_results.update({n: pool.score(HOSTILE[n], "5")}))
               for n in names]  # two hostile samples at once, one per worker, from two threads
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    elapsed = time.monotonic() - start
    for name in names:
        outcome = threads_results[name]
        assert outcome.reward == 0.0 and outcome.seconds <= TIMEOUT_S + 1.0, (name, outcome)
    assert elapsed <= TIMEOUT_S + 1.0, (names, elapsed)
    after = in_thread(pool.score, r"so \boxed{5}", 5)  # the pool keeps working
    assert (after.reward, after.timed_out, after.error) == (1.0, False, None)
    replaced = set(pids) - set(pool.worker_pids())
    assert_reaped(replaced)


def test_crashes_hangs_and_memory_blowups_are_contained(pool):
    pairs = [(r"\boxed{1}", 1), ("exit", 1), (r"\boxed{2}", 2), ("hang", 1), (r"\boxed{3}", 4), ("oom", 1),
             ("sigkill", 1), (r"\boxed{4}", 4)]
    outcomes = in_thread(pool.score_batch, pairs)
    assert [o.reward for o in outcomes] == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert "exit code 3" in outcomes[1].error
    assert outcomes[3].timed_out and outcomes[3].seconds < TIMEOUT_S + 1.0
    assert outcomes[5].error.startswith("MemoryError") and not outcomes[5].timed_out
    assert "exit code -9" in outcomes[6].error
    assert [o.timed_out for o in outcomes].count(True) == 1
    assert pool.score(r"\boxed{\frac{1}{2}}", "0.5").reward == 1.0


def test_hostile_outputs_against_a_several_answer_gold_are_bounded_by_the_timeout(pool):
    """Such a gold is scored on the whole response, not its last box alone: the pool's kill still bounds it."""
    pairs = [(HOSTILE[name] + r" so \boxed{1}, \boxed{2}", "1, 2") for name in HOSTILE]
    outcomes = in_thread(pool.score_batch, pairs)
    assert all(outcome.seconds <= TIMEOUT_S + 1.0 for outcome in outcomes), outcomes
    assert any(outcome.timed_out for outcome in outcomes), outcomes  # the whole text was parsed
    assert in_thread(pool.score, r"so \boxed{2}, \boxed{1}", "1, 2").reward == 1.0


def test_concurrent_batches_from_threads_keep_their_order(pool):
    def batch(offset):
        pairs = [(response_with(str(offset + i)), offset + i + (i % 2)) for i in range(40)]
        return [o.reward for o in pool.score_batch(pairs)]

    results = {}
    threads = [threading.Thread(target=lambda k=k: results.update({k: batch(1000 * k)})) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {k: [1.0, 0.0] * 20 for k in range(4)}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="processes"):
        RewardPool(processes=0)
    with pytest.raises(ValueError, match="timeout_s"):
        RewardPool(timeout_s=0)


def test_bad_gold_in_a_batch_is_named_before_anything_runs(pool):
    with pytest.raises(ValueError, match=r"pairs\[1\]: gold is None"):
        pool.score_batch([(r"\boxed{1}", 1), (r"\boxed{1}", None)])


def test_close_reaps_every_worker_and_refuses_new_work():
    pool = RewardPool(processes=2, timeout_s=TIMEOUT_S)
    assert pool.score(r"\boxed{2}", 2.0).reward == 1.0
    pids = pool.worker_pids()
    pool.close()
    pool.close()  # idempotent
    assert_reaped(pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.score(r"\boxed{2}", 2)


def test_every_eval_record_agrees_with_its_gold():
    """`\\boxed{<gold>}` scores 1 and a clearly wrong answer 0 on all 1,547 records of the six sets."""
    golds = load_golds(DATA_DIR)
    pairs, labels = [], []
    for benchmark, benchmark_golds in golds.items():
        for gold in benchmark_golds:
            first = normalize_gold(gold)[0]
            wrong = wrong_answer(gold) if plain_number(first) is not None else CONSTANT_WRONG
            pairs += [(response_with(first), gold), (response_with(wrong), gold)]
            labels += [(benchmark, gold, 1.0), (benchmark, gold, 0.0)]
    assert len(pairs) == 2 * 1547
    start = time.monotonic()
    with RewardPool(processes=2, timeout_s=10.0) as pool:
        outcomes = pool.score_batch(pairs)
    misses = [(label, outcome) for label, outcome in zip(labels, outcomes) if outcome.reward != label[2]]
    # Measured: every record agrees (1547/1547) and every wrong answer is rejected (1547/1547).
    assert not misses, misses[:20]
    assert time.monotonic() - start < 120
