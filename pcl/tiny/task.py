"""The tiny synthetic task: additions of 1- to 4-digit numbers, graded by difficulty.

    rows = make_dataset(4096, seed=0, split="train")
    rows[0]   # {"id": "tiny-train-000000", "problem": "127+28", "answer": "155", "difficulty": 4}
    format_prompt(rows[0]["problem"])   # "127+28=": the text the policy sees; it answers "155" then EOS

Difficulty levels are the operand sizes (`LEVELS`): level 1 adds two 1-digit numbers, level 7 two
4-digit numbers. The warm-started tiny policy solves level 1 about 90% of the time and levels 6-7 about
20%, with most prompts of the levels between at intermediate pass rates: the prompts a curriculum
should pick. (Operands of unequal length are a little harder than their level suggests.)

Train and eval splits are disjoint by construction: an unordered operand pair belongs to exactly one
split, decided by a hash that depends on neither seed nor size (so "3+5" and "5+3" share a split).
A dataset is deterministic for (size, seed, split), and a smaller dataset is a prefix of a larger one
with the same seed and split.
"""

from __future__ import annotations

import hashlib
import random
from typing import NamedTuple


class Level(NamedTuple):
    """One difficulty level: the digit counts of the two operands (their order is random)."""

    digits_a: int
    digits_b: int

    @property
    def name(self) -> str:
        return f"{self.digits_a}+{self.digits_b} digits"


# Difficulty 1..7, in order of how late a policy learns them.
LEVELS: tuple[Level, ...] = (
    Level(1, 1), Level(2, 1), Level(2, 2), Level(3, 2), Level(3, 3), Level(4, 3), Level(4, 4),
)
# Share of each level in a dataset (same order as LEVELS); weighted towards the middle and upper levels so
# that the warm-started policy has many prompts of intermediate pass rate, and easy and hard ones too.
LEVEL_WEIGHTS: tuple[float, ...] = (0.05, 0.10, 0.15, 0.20, 0.20, 0.15, 0.15)
SPLITS = ("train", "eval")
# One in EVAL_SHARE_INVERSE operand pairs belongs to the eval split.
EVAL_SHARE_INVERSE = 8
# Draws tried for a problem not yet in the dataset before a duplicate is accepted (small levels run out).
_UNIQUE_TRIES = 8


def format_prompt(problem: str) -> str:
    """The prompt text the policy sees for a problem: "12+345" -> "12+345="."""
    if not isinstance(problem, str) or not problem:
        raise ValueError(f"problem must be a non-empty string like '12+345', got {problem!r}")
    return f"{problem}="


def split_of(a: int, b: int) -> str:
    """The split the unordered operand pair {a, b} belongs to; independent of seed and dataset size."""
    low, high = sorted((a, b))
    digest = hashlib.blake2b(f"{low}+{high}".encode(), digest_size=8).digest()
    return "eval" if int.from_bytes(digest, "big") % EVAL_SHARE_INVERSE == 0 else "train"


def _operand(rng: random.Random, digits: int) -> int:
    # A d-digit number has no leading zero; 1-digit operands include 0.
    return rng.randint(0, 9) if digits == 1 else rng.randint(10 ** (digits - 1), 10**digits - 1)


def _draw(rng: random.Random, level: Level, split: str) -> tuple[int, int]:
    """An operand pair of this level that belongs to `split` (rejection sampling on the split hash)."""
    while True:
        a, b = _operand(rng, level.digits_a), _operand(rng, level.digits_b)
        if rng.random() < 0.5:
            a, b = b, a
        if split_of(a, b) == split:
            return a, b


def make_dataset(size: int, seed: int, split: str) -> list[dict]:
    """`size` addition problems of the given split, mixed over LEVELS by LEVEL_WEIGHTS.

    Each row: id ("tiny-<split>-<index:06d>"), problem ("a+b"), answer (str of a+b), difficulty (1..7,
    the 1-based index into LEVELS). Problems are unique within a dataset while a level has unused ones.
    """
    check_dataset_args(size, seed, split)
    rng = random.Random(f"pcl-tiny:{split}:{seed}")
    seen: set[tuple[int, int]] = set()
    rows = []
    for index in range(size):
        level_index = rng.choices(range(len(LEVELS)), weights=LEVEL_WEIGHTS)[0]
        for _ in range(_UNIQUE_TRIES):
            a, b = _draw(rng, LEVELS[level_index], split)
            if (a, b) not in seen:
                break
        seen.add((a, b))
        rows.append({
            "id": f"tiny-{split}-{index:06d}",
            "problem": f"{a}+{b}",
            "answer": str(a + b),
            "difficulty": level_index + 1,
        })
    return rows


def check_dataset_args(size, seed, split) -> None:
    """A ValueError naming the bad argument of a tiny dataset: size a non-negative int, seed an int, split one
    of SPLITS."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
