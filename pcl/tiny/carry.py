"""The tiny task in the paper's regime (`data.source: tiny-carry`): additions of two n-digit numbers, n = 1..6, that
the policy answers with a written scratchpad, one column at a time from the units, before the sum.

    rows = make_dataset(4096, seed=0, split="train")
    rows[0]   # {"id": "tiny-carry-train-000000", "problem": "487+356", "answer": "843", "difficulty": 3}
    format_prompt("487+356")   # "487+356=" (the arithmetic task's prompt)
    solution("487+356")        # "7+6=13,8+5+1=14,4+3+1=8,\\boxed{843}": what the warm-up teaches, then EOS

Each column is written as its two digits, the carry when there is one, and their sum; the sum follows, boxed
("\\boxed{" is one token of the task's tokenizer). A response is 8 to 64 tokens (about 8 per column), so
generation, not the learner, takes most of a step, as it does for the paper's reasoning models. The reward is the
project's math reward, which reads the last box (without a box, math-verify reads the whole text: a 1-digit
problem's scratchpad alone, "1+5=6,", then scores 1, a longer one's 0).

Why this shape (docs/results/tiny-task.md has the target profile and the measured one): a base model on MATH or
DeepScaleR meets many prompts it always solves and many it never does, with a minority in between, so uniform
GRPO wastes much of its generation on groups without signal. Here difficulty is the number of columns, and errors
compound over the columns of a long scratchpad, so short additions are solved almost always and long ones almost
never. The supervised warm-up (`pcl.tiny.build`, task "tiny-carry") sees mostly short additions (WARMUP_WEIGHTS,
as pre-training data hold more easy material than hard), while the RL training and held-out sets hold every
length equally (LEVEL_WEIGHTS). Train and eval splits are disjoint by the arithmetic task's operand-pair hash.
"""

from __future__ import annotations

import random

from pcl.tiny.task import check_dataset_args, format_prompt, split_of

__all__ = ["LEVELS", "LEVEL_WEIGHTS", "WARMUP_WEIGHTS", "format_prompt", "make_dataset", "solution"]

# Difficulty n = 1..6: both operands have n digits.
LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
LEVEL_WEIGHTS: tuple[float, ...] = (1 / 6,) * 6  # the RL training and held-out sets: every length alike
WARMUP_WEIGHTS: tuple[float, ...] = (0.30, 0.25, 0.20, 0.13, 0.08, 0.04)  # the warm-up: mostly short ones
_UNIQUE_TRIES = 8


def level_name(level: int) -> str:
    return f"{level}+{level} digits"


def solution(problem: str) -> str:
    """The scratchpad and sum for "a+b": columns from the units, "da+db[+1]=s", joined by ",", then ",\\boxed{a+b}"."""
    try:
        a_text, b_text = problem.split("+")
        a, b = int(a_text), int(b_text)
    except ValueError:
        raise ValueError(f"problem must look like '487+356', got {problem!r}") from None
    width = max(len(a_text), len(b_text))
    a_digits, b_digits = a_text.zfill(width)[::-1], b_text.zfill(width)[::-1]
    columns, carry = [], 0
    for da, db in zip(a_digits, b_digits):
        total = int(da) + int(db) + carry
        columns.append(f"{da}+{db}" + ("+1" if carry else "") + f"={total}")
        carry = total // 10
    return ",".join(columns) + f",\\boxed{{{a + b}}}"


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0, 9) if digits == 1 else rng.randint(10 ** (digits - 1), 10**digits - 1)


def make_dataset(size: int, seed: int, split: str, weights: tuple[float, ...] = LEVEL_WEIGHTS,
                 stream: str = "") -> list[dict]:
    """`size` problems of the split, levels mixed by `weights` (the warm-up passes WARMUP_WEIGHTS and its own
    `stream`, so its rows are drawn apart from the RL training rows).

    Each row: id ("tiny-carry-<split>-<index:06d>"), problem ("a+b"), answer (str of a+b), difficulty (n). A
    dataset is deterministic for (size, seed, split, weights, stream) and a prefix of a larger one.
    """
    check_dataset_args(size, seed, split)
    if len(weights) != len(LEVELS) or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"weights must be {len(LEVELS)} non-negative numbers, not all 0, got {weights!r}")
    rng = random.Random(f"pcl-tiny-carry:{split}:{seed}:{stream}")
    seen: set[tuple[int, int]] = set()
    rows = []
    for index in range(size):
        level = rng.choices(LEVELS, weights=weights)[0]
        for _ in range(_UNIQUE_TRIES):
            while True:
                a, b = _operand(rng, level), _operand(rng, level)
                if split_of(a, b) == split:
                    break
            if (a, b) not in seen:
                break
        seen.add((a, b))
        rows.append({"id": f"tiny-carry-{split}-{index:06d}", "problem": f"{a}+{b}", "answer": str(a + b),
                     "difficulty": level})
    return rows
