"""Prompt datasets: rows from a local file, a Hugging Face dataset or the tiny task, turned into templated
`PromptRecord`s, with a report of every row that was skipped and why.

    records, report = load_prompts(cfg.data, tokenizer)                # training side: data.source
    records, report = load_prompts(cfg.data, tokenizer, split="eval")  # held-out side: data.eval_source
    print(report.summary())

A bad row never stops a run: a row without a question, with a null / empty / NaN answer, with text that is
not valid UTF-8, or whose prompt is over `max_prompt_tokens` is skipped and counted, and one warning per load
names the count and the first ids. Prompts are never truncated (a cut question has a different answer).
Without a tokenizer the length check is skipped, and the report says so. A source that cannot be used at all
(missing path, not JSON, not one usable row, a hub dataset with the hub unreachable and no cached copy) is an
error naming the source.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

from pcl.config import TINY_SOURCES, DataConfig
from pcl.data.datasets import data_root, fields_for, lookup, read_known
from pcl.data.rows import UnreadableRow, load_rows
from pcl.data.templates import apply_template

log = logging.getLogger(__name__)

Answer = Union[str, float, int, list[str]]
_FIRST_IDS = 5  # skipped ids named in warnings and kept in reports
_TOKENIZE_CHUNK = 512  # prompts per tokenizer call


@dataclass(frozen=True)
class PromptRecord:
    id: str  # stable row id: the id field's value, or the row's position in the source ("0", "1", ...)
    problem: str  # the raw question, as stored in the dataset
    answer: Answer  # gold answer for the verifier: text, a number, or a list of acceptable texts
    prompt: str  # the templated text the policy continues
    prompt_token_ids: tuple[int, ...] | None  # `prompt` tokenized; None when loaded without a tokenizer


@dataclass
class DatasetReport:
    """What a load kept and skipped. Every row of the source is counted in exactly one field."""

    total: int = 0
    kept: int = 0
    skipped_missing: int = 0  # no question (or no id, when an id field is configured)
    skipped_empty_answer: int = 0  # answer absent, null, empty text, empty list or NaN
    skipped_too_long: int = 0  # prompt over max_prompt_tokens (only checked with a tokenizer)
    skipped_bad: int = 0  # not a JSON object, not valid UTF-8, or a field of the wrong type
    first_skipped_ids: list[str] = field(default_factory=list)  # ids (or "line N") of the first skips
    length_checked: bool = False  # False: no tokenizer was given, so prompt lengths were not checked

    @property
    def skipped(self) -> int:
        return self.skipped_missing + self.skipped_empty_answer + self.skipped_too_long + self.skipped_bad

    def summary(self) -> str:
        text = (
            f"kept {self.kept} of {self.total} rows; skipped {self.skipped_missing} without a question or "
            f"id, {self.skipped_empty_answer} with a null or empty answer, {self.skipped_too_long} too long, "
            f"{self.skipped_bad} unreadable"
        )
        if self.first_skipped_ids:
            text += f" (first skipped: {', '.join(self.first_skipped_ids)})"
        if not self.length_checked:
            text += "; prompt lengths not checked (no tokenizer)"
        return text


# ---------------------------------------------------------------------------------------------------------
# Rows -> prompt records


class _Skip(NamedTuple):
    row_id: str
    reason: str  # "missing", "empty_answer" or "bad": the DatasetReport counter it goes to


_EMPTY = object()  # a null / empty / NaN answer
_BAD = object()  # a value of a type the field cannot hold


def build_prompts(
    rows: list[dict], data_cfg: DataConfig, tokenizer: Any = None, *, source: str = "<rows>"
) -> tuple[list[PromptRecord], DatasetReport]:
    """Map fields, skip unusable rows, apply the template, drop over-long prompts; never truncates.

    Token ids are the tokenizer's encoding of the prompt text, with its special tokens (BOS, ...) except for
    the chat template, whose text already holds them. Raises ValueError when ids repeat or no row is usable.
    """
    report = DatasetReport(total=len(rows), length_checked=tokenizer is not None)
    if not rows:
        raise ValueError(f"data source {source!r} has no rows")
    parsed: list[tuple[str, str, Answer]] = []
    for position, row in enumerate(rows):
        outcome = _parse_row(position, row, data_cfg)
        if isinstance(outcome, _Skip):
            _count_skip(report, outcome.reason, outcome.row_id)
        else:
            parsed.append(outcome)
    _check_unique_ids(parsed, data_cfg, source)
    prompts = [apply_template(problem, data_cfg.template, tokenizer) for _, problem, _ in parsed]
    token_ids: list[tuple[int, ...] | None] = [None] * len(prompts)
    if tokenizer is not None:
        token_ids = _tokenize(tokenizer, prompts, add_special_tokens=data_cfg.template != "chat")
    records = []
    for (row_id, problem, answer), prompt, ids in zip(parsed, prompts, token_ids):
        if ids is not None and len(ids) > data_cfg.max_prompt_tokens:
            _count_skip(report, "too_long", row_id)
            continue
        records.append(PromptRecord(row_id, problem, answer, prompt, ids))
    report.kept = len(records)
    if report.skipped:
        log.warning("data source %r: skipped %d of %d rows: %s", source, report.skipped, report.total,
                    report.summary())
    if not records:
        fields = sorted(next((r for r in rows if isinstance(r, dict) and r), {}))
        raise ValueError(
            f"data source {source!r}: no usable row ({report.summary()}); configured fields: prompt_field="
            f"{data_cfg.prompt_field!r}, answer_field={data_cfg.answer_field!r}; fields in the data: {fields}"
        )
    return records, report


def _count_skip(report: DatasetReport, reason: str, row_id: str) -> None:
    name = f"skipped_{reason}"
    setattr(report, name, getattr(report, name) + 1)
    if len(report.first_skipped_ids) < _FIRST_IDS:
        report.first_skipped_ids.append(row_id)


def _parse_row(position: int, row: Any, cfg: DataConfig) -> _Skip | tuple[str, str, Answer]:
    """(id, problem, answer) of a usable row, else why it is skipped."""
    if isinstance(row, UnreadableRow):
        return _Skip(row.where, "bad")
    if not isinstance(row, dict):
        return _Skip(str(position), "bad")
    row_id = str(position)
    if cfg.id_field is not None:
        raw_id = row.get(cfg.id_field)
        if raw_id is None or (isinstance(raw_id, float) and math.isnan(raw_id)):
            return _Skip(f"row {position}", "missing")
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int, float)):
            return _Skip(f"row {position}", "bad")
        if not _is_clean(str(raw_id)):
            return _Skip(f"row {position}", "bad")
        row_id = str(raw_id)
    problem = row.get(cfg.prompt_field)
    if problem is None or (isinstance(problem, str) and not problem.strip()):
        return _Skip(row_id, "missing")
    if not isinstance(problem, str) or not _is_clean(problem):
        return _Skip(row_id, "bad")
    answer = _clean_answer(row.get(cfg.answer_field))
    if answer is _EMPTY:
        return _Skip(row_id, "empty_answer")
    if answer is _BAD:
        return _Skip(row_id, "bad")
    return row_id, problem, answer


def _clean_answer(value: Any) -> Any:
    """The answer as a str, a finite number or a list of str; else _EMPTY or _BAD."""
    if value is None:
        return _EMPTY
    if isinstance(value, bool):
        return _BAD
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return _EMPTY
        return value if math.isfinite(value) else _BAD
    if isinstance(value, str):
        if not value.strip():
            return _EMPTY
        return value if _is_clean(value) else _BAD
    if isinstance(value, (list, tuple)):
        items = [_clean_answer(item) for item in value]
        if any(item is _BAD or isinstance(item, list) for item in items):
            return _BAD
        kept = [item if isinstance(item, str) else str(item) for item in items if item is not _EMPTY]
        return kept if kept else _EMPTY
    return _BAD


def _is_clean(text: str) -> bool:
    """False for text holding lone surrogates: undecodable bytes of the file, or a bad \\ud800 escape."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_unique_ids(parsed: list[tuple[str, str, Answer]], cfg: DataConfig, source: str) -> None:
    # Ids key per-prompt state (stream idempotency keys, reward history); a repeat would merge two prompts.
    seen: set[str] = set()
    for row_id, _, _ in parsed:
        if row_id in seen:
            raise ValueError(
                f"data source {source!r}: id {row_id!r} (field {cfg.id_field!r}) is used by more than one "
                "row; ids must be unique: fix the data or set data.id_field=null to use row positions"
            )
        seen.add(row_id)


def _tokenize(tokenizer: Any, prompts: list[str], add_special_tokens: bool) -> list[tuple[int, ...] | None]:
    ids: list[tuple[int, ...] | None] = []
    for start in range(0, len(prompts), _TOKENIZE_CHUNK):
        batch = tokenizer(prompts[start : start + _TOKENIZE_CHUNK], add_special_tokens=add_special_tokens)
        ids.extend(tuple(seq) for seq in batch["input_ids"])
    return ids


# ---------------------------------------------------------------------------------------------------------


def load_prompts(
    data_cfg: DataConfig, tokenizer: Any = None, split: str = "train", seed: int = 0
) -> tuple[list[PromptRecord], DatasetReport]:
    """The prompt records of one side of the data, with the report of what was skipped.

    split="train": data.source (Hugging Face split data.split; the tiny task: data.tiny_size rows).
    Any other split is the held-out side: data.eval_source, read with that Hugging Face split ("eval"
    reads "test", the benchmarks' convention), or the tiny task's eval split with data.eval_size rows.
    """
    revision = None  # data.revision pins the training source; held-out sets are not resumed from
    if split == "train":
        source, hf_split, tiny_split, size = data_cfg.source, data_cfg.split, "train", data_cfg.tiny_size
        revision = data_cfg.revision
    else:
        if data_cfg.eval_source is None:
            raise ValueError("data.eval_source is not set: there is no held-out set to load")
        source, tiny_split, size = data_cfg.eval_source, "eval", data_cfg.eval_size
        hf_split = "test" if split == "eval" else split
    known = lookup(source)
    if known is not None:  # a known dataset: its own split and field mapping, a local copy when there is one
        root = data_root(data_cfg.root)
        fields = fields_for(known, root)
        data_cfg = data_cfg.model_copy(update={"prompt_field": fields.prompt, "answer_field": fields.answer,
                                               "id_field": fields.id})
        return build_prompts(read_known(known, root, revision), data_cfg, tokenizer, source=source)
    rows = load_rows(source, tiny_split if source in TINY_SOURCES else hf_split, size=size, seed=seed, revision=revision)
    return build_prompts(rows, data_cfg, tokenizer, source=source)
