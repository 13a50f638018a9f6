r"""Math-reward agreement and throughput on the shipped evaluation sets.

    python -m bench.reward_agreement [--data-dir ../shared/data/math] [--processes 2] [--timeout-s 5]

For every record of MATH500, AIME24, AIME25, AMC23, Minerva and OlympiadBench it scores, through
`RewardPool`, a response ending in "\boxed{<gold>}" (must score 1: agreement) and two wrong ones, the gold
perturbed (a number plus one, or its first digit bumped) and "\boxed{-12345.678}" (both must score 0:
rejection). On OlympiadBench's records of several answers it scores responses that box each answer on
its own (joined by commas or "and", one missing, one too many) against math-verify alone. Then it times
2,000 realistic responses (~300 characters ending in a boxed answer, half of them correct) on the pool
against serial in-process `math_reward`, the peer. The last line is the overall agreement.
`tests/pcl/test_reward.py` reuses the loaders, the wrong-answer rule and the several-answer pairs from here.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path
from typing import Any

from bench import ROOT as REPO, add_json_option, run, write_figures
from pcl.reward.pool import RewardPool
from pcl.reward.verdict import math_reward, normalize_gold, plain_number

BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench")
DEFAULT_DATA_DIR = REPO.parent / "shared" / "data" / "math"
CONSTANT_WRONG = "-12345.678"


def record_gold(benchmark: str, record: dict[str, Any]) -> Any:
    """The gold as `math_reward` takes it: OlympiadBench's list, Minerva's answer plus alternatives."""
    if benchmark == "olympiadbench":
        return record["final_answer"]
    if benchmark == "minerva_math":
        return list(dict.fromkeys([record["answer"], *(record.get("answer_alternatives") or [])]))
    return record["answer"]


def load_golds(data_dir: Path) -> dict[str, list[Any]]:
    """Benchmark name -> the gold of every record, in file order."""
    golds = {}
    for benchmark in BENCHMARKS:
        with open(data_dir / f"{benchmark}.jsonl") as lines:
            golds[benchmark] = [record_gold(benchmark, json.loads(line)) for line in lines if line.strip()]
    return golds


def multi_answer_golds(data_dir: Path) -> list[str]:
    """The gold of every OlympiadBench record marked as having several answers (`is_multiple_answer`)."""
    with open(data_dir / "olympiadbench.jsonl") as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    return [record["final_answer"][0] for record in records if record.get("is_multiple_answer")]


def gold_answers(gold: str) -> list[str]:
    """The answers of a several-answer gold: its text split at commas outside brackets, dollars dropped.

    >>> gold_answers("$(1,2),(2,1)$"), gold_answers("$69$,$84$")
    (['(1,2)', '(2,1)'], ['69', '84'])
    """
    answers, depth, current = [], 0, ""
    for char in gold.replace("$", ""):
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            answers.append(current.strip())
            current = ""
        else:
            current += char
    return [answer for answer in answers + [current.strip()] if answer]


def several_answer_pairs(golds: list[str]) -> list[tuple[str, str]]:
    """Per gold of two or more answers, six responses that box each answer on its own: joined by commas, by
    "and" in reverse order, by "\\text{ and }" inside dollars, one answer missing, one answer too many,
    and all of them after an earlier wrong box."""
    pairs = []
    for gold in golds:
        boxes = [f"\\boxed{{{answer}}}" for answer in gold_answers(gold)]
        if len(boxes) < 2:
            continue
        wrong = f"\\boxed{{{CONSTANT_WRONG}}}"
        joined = ", ".join(boxes)
        responses = (joined, " and ".join(boxes[::-1]), "$" + r" \text{ and } ".join(boxes) + "$",
                     ", ".join(boxes[1:]), f"{joined}, {wrong}", f"First {wrong}. Then {joined}")
        pairs += [(response, gold) for response in responses]
    return pairs


def math_verify_verdict(response: str, gold: Any) -> float:
    """math-verify alone, the peer: any boxed gold alternative against its extraction of the response."""
    from math_verify import parse, verify

    predicted = parse(response)
    golds = [parse(f"\\boxed{{{alternative}}}") for alternative in normalize_gold(gold)]
    return float(any(verify(parsed_gold, predicted) for parsed_gold in golds))


def wrong_answer(gold: Any) -> str:
    """A clearly different answer: integers plus one, other numbers doubled plus one (math-verify compares
    at 15 significant digits: 6.43e16 + 1 would still equal 6.43e16), otherwise the first digit bumped
    (14/3 -> 24/3), otherwise the gold plus one."""
    text = normalize_gold(gold)[0]
    number = plain_number(text)
    if number is not None:
        if number == number.to_integral_value() and abs(number) < 10**9:
            return str(int(number) + 1)
        return str(number * 2 + 1)
    digit = re.search(r"\d", text)
    if digit is not None:
        bumped = str((int(digit.group()) + 1) % 10)
        return text[: digit.start()] + bumped + text[digit.end() :]
    return f"{text} + 1"


def response_with(answer: str, filler: str = "We simplify both sides and check the cases") -> str:
    return f"{filler}; so the answer is \\boxed{{{answer}}}."


def agreement_pairs(golds: list[Any]) -> list[tuple[str, Any]]:
    """Per gold, adjacent so a worker parses each gold once: correct, perturbed, constant wrong."""
    pairs = []
    for gold in golds:
        pairs.append((response_with(normalize_gold(gold)[0]), gold))
        pairs.append((response_with(wrong_answer(gold)), gold))
        pairs.append((response_with(CONSTANT_WRONG), gold))
    return pairs


def realistic_batch(golds: list[Any], size: int, seed: int = 0) -> list[tuple[str, Any]]:
    """`size` responses of ~300 characters of reasoning ending in a boxed answer, every other one correct."""
    rng = random.Random(seed)
    steps = ["Let $x$ be the unknown quantity.", "Squaring both sides gives $x^2 = 4y + 1$.",
             "By symmetry the two cases are the same.", "Substituting back, $3x - 7 = 2$, so $x = 3$.",
             "The discriminant $b^2 - 4ac$ is positive.", "Summing the series term by term,"]
    batch = []
    for index in range(size):
        gold = golds[(index // 4) % len(golds)]  # four samples per prompt, like n = 4 rollouts
        filler = " ".join(rng.choice(steps) for _ in range(7))
        answer = normalize_gold(gold)[0] if index % 2 == 0 else wrong_answer(gold)
        batch.append((response_with(answer, filler), gold))
    return batch


def print_throughput(pool: RewardPool, processes: int, label: str, batch: list[tuple[str, Any]]) -> None:
    """Samples per second of `batch` on the pool and serially in-process, and whether the rewards agree."""
    start = time.perf_counter()
    pooled = pool.score_batch(batch)
    pool_seconds = time.perf_counter() - start
    start = time.perf_counter()
    serial = [math_reward(response, gold) for response, gold in batch]
    serial_seconds = time.perf_counter() - start
    same = sum(outcome.reward == reward for outcome, reward in zip(pooled, serial))
    chars = sum(len(response) for response, _ in batch) // len(batch)
    print(f"throughput, {len(batch)} responses of ~{chars} chars, {label}, half correct: "
          f"pool({processes}) {len(batch) / pool_seconds:.0f} samples/s, serial in-process "
          f"{len(batch) / serial_seconds:.0f} samples/s (x{serial_seconds / pool_seconds:.2f}; "
          f"same reward on {same}/{len(batch)})")


HEADER = (f"{'benchmark':<14}{'records':>8}{'agree':>9}{'reject+':>9}{'reject c':>9}{'seconds':>9}"
          f"{'samples/s':>10}")


def print_agreement(pool: RewardPool, benchmark: str, golds: list[Any]) -> tuple[int, int, int, int]:
    """One table row, then every miss; returns (records, agreed, perturbed rejected, constant rejected)."""
    start = time.perf_counter()
    outcomes = pool.score_batch(agreement_pairs(golds))
    seconds = time.perf_counter() - start
    n = len(golds)
    counts = (n, sum(o.reward == 1.0 for o in outcomes[0::3]), sum(o.reward == 0.0 for o in outcomes[1::3]),
              sum(o.reward == 0.0 for o in outcomes[2::3]))
    print(f"{benchmark:<14}{n:>8}{counts[1] / n:>9.2%}{counts[2] / n:>9.2%}{counts[3] / n:>9.2%}"
          f"{seconds:>9.1f}{3 * n / seconds:>10.0f}")
    for index, outcome in enumerate(outcomes):
        if outcome.reward != (1.0 if index % 3 == 0 else 0.0):
            kind = ("agree", "perturbed", "constant")[index % 3]
            why = " (timed out)" if outcome.timed_out else f" ({outcome.error})" if outcome.error else ""
            print(f"    miss, {kind}: gold {golds[index // 3]!r:.100}{why}")
    return counts


def print_several_answers(pool: RewardPool, golds: list[str]) -> None:
    """Agreement with math-verify alone on responses that box each answer of a several-answer gold."""
    pairs = several_answer_pairs(golds)
    start = time.perf_counter()
    outcomes = pool.score_batch(pairs)
    seconds = time.perf_counter() - start
    expected = [math_verify_verdict(response, gold) for response, gold in pairs]
    same = sum(outcome.reward == want for outcome, want in zip(outcomes, expected))
    print(f"OlympiadBench several answers: {len(golds)} records, {len(pairs)} responses boxing each answer; "
          f"math-verify scores {sum(expected):.0f} of them 1, the reward "
          f"{sum(outcome.reward for outcome in outcomes):.0f}; "
          f"agreement with math-verify {same / len(pairs):.2%} ({same}/{len(pairs)}), pool {seconds:.1f} s")
    misses = [(pair, got, want) for pair, got, want in zip(pairs, outcomes, expected) if got.reward != want]
    for (response, gold), outcome, want in misses[:10]:
        print(f"    miss: reward {outcome.reward:.0f}, math-verify {want:.0f}: {response!r:.80} "
              f"vs gold {gold!r:.60}")
    if len(misses) > 10:
        print(f"    ... and {len(misses) - 10} more misses")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--throughput-samples", type=int, default=2000)
    add_json_option(parser)
    args = parser.parse_args(argv)
    golds = load_golds(args.data_dir)
    integer_golds = golds["aime24"] + golds["aime25"] + golds["amc23"]
    with RewardPool(args.processes, args.timeout_s) as pool:
        pool.wait_ready()
        print(HEADER)
        rows = [print_agreement(pool, name, benchmark_golds) for name, benchmark_golds in golds.items()]
        print_several_answers(pool, multi_answer_golds(args.data_dir))
        for label, batch_golds in (("MATH500 golds", golds["math500"]), ("AIME/AMC golds", integer_golds)):
            batch = realistic_batch(batch_golds, args.throughput_samples)
            print_throughput(pool, args.processes, label, batch)
    n, agreed, perturbed, constant = (sum(column) for column in zip(*rows))
    print(f"overall: agreement {agreed / n:.2%} ({agreed}/{n}), wrong answers rejected: perturbed "
          f"{perturbed / n:.2%} ({perturbed}/{n}), constant {constant / n:.2%} ({constant}/{n})")
    per_benchmark = {name: dict(zip(("records", "agreed", "perturbed_rejected", "constant_rejected"), row))
                     for name, row in zip(golds, rows)}
    return write_figures(args.json, {"records": n, "agreed": agreed, "agreement": agreed / n,
                                     "perturbed_rejected": perturbed, "constant_rejected": constant,
                                     "benchmarks": per_benchmark})


if __name__ == "__main__":
    run(main)
