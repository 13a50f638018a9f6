"""The tiny task families, by the name a config gives them (`data.source`, `model.path`, `pcl make-tiny --task`):

- "tiny": additions of 1- to 4-digit numbers answered with the sum alone (`pcl.tiny.task`);
- "tiny-carry": additions of two 1- to 6-digit numbers answered with a column-by-column scratchpad, built to the
  paper's regime: most prompts always or never solved by the warm-started policy (`pcl.tiny.carry`).

    task = tiny_task("tiny-carry")
    rows = task.train_rows(4096, seed=0); task.response(rows[0])   # what the warm-up teaches for a row

Both use the prompt "a+b=" (data.template: tiny) and the project's math reward against the sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pcl.tiny import carry, task
from pcl.tiny.tokenizer import BOXED


@dataclass(frozen=True)
class TinyTask:
    name: str
    symbols: tuple[str, ...]  # the tokenizer's characters besides the specials
    max_positions: int  # the policy's context: the longest prompt and response fit
    train_rows: Callable[[int, int], list[dict]]  # (size, seed): the RL training split (train.jsonl)
    eval_rows: Callable[[int, int], list[dict]]  # (size, seed): the held-out split (eval.jsonl)
    warmup_rows: Callable[[int, int], list[dict]]  # (size, seed): what the supervised warm-up trains on
    response: Callable[[dict], str]  # the target text of a row for the warm-up (EOS follows)
    level_name: Callable[[int], str]
    # The warm-up's probe stop (see pcl.tiny.build): the target mean sampled pass rate on training prompts, the
    # first step probed, the most steps and the step where the learning rate reaches its floor.
    target_pass_rate: float
    probe_from: int
    warmup_steps: int
    decay_steps: int


ARITH = TinyTask(
    name="tiny", symbols=tuple("0123456789") + ("+", "-", "*", "="), max_positions=64,
    train_rows=lambda size, seed: task.make_dataset(size, seed, "train"),
    eval_rows=lambda size, seed: task.make_dataset(size, seed, "eval"),
    warmup_rows=lambda size, seed: task.make_dataset(size, seed, "train"),  # train.jsonl is its prefix
    response=lambda row: row["answer"], level_name=lambda level: task.LEVELS[level - 1].name,
    target_pass_rate=0.40, probe_from=400, warmup_steps=1200, decay_steps=800,
)

CARRY = TinyTask(
    name="tiny-carry", symbols=tuple("0123456789") + ("+", "-", "*", "=", ",", BOXED, "}"), max_positions=128,
    train_rows=lambda size, seed: carry.make_dataset(size, seed, "train"),
    eval_rows=lambda size, seed: carry.make_dataset(size, seed, "eval"),
    warmup_rows=lambda size, seed: carry.make_dataset(size, seed, "train", carry.WARMUP_WEIGHTS, stream="warmup"),
    response=lambda row: carry.solution(row["problem"]), level_name=carry.level_name,
    target_pass_rate=0.45, probe_from=100, warmup_steps=1200, decay_steps=800,
)

TASKS: dict[str, TinyTask] = {t.name: t for t in (ARITH, CARRY)}


def tiny_task(name: str) -> TinyTask:
    """The task family of that name; ValueError listing the names otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown tiny task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def make_dataset(name: str, size: int, seed: int, split: str) -> list[dict]:
    """`size` rows of a task family's split ("train" or "eval")."""
    family = tiny_task(name)
    if split not in task.SPLITS:
        raise ValueError(f"split must be one of {task.SPLITS}, got {split!r}")
    return (family.train_rows if split == "train" else family.eval_rows)(size, seed)
