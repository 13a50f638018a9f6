"""Datasets by name: the training sets and benchmarks of the paper, with their field mappings.

    known = lookup("math500")                           # -> KnownDataset; None for other sources
    rows = read_known(known, data_root(cfg.data.root))  # its local copy under the root, else the hub

A known dataset can be named by its short name (`math500`) or its Hugging Face name
(`HuggingFaceH4/MATH-500`). Its rows are read from a local copy when the data root (`data.root`, else the
`PCL_DATA_ROOT` environment variable) holds its file, else from the hub with `datasets`. Each source has its
own field mapping (a hub dataset and a local copy may name fields differently); where the gold answer is only
inside a worked solution (MATH-lighteval), it is the solution's last `\\boxed{...}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pcl.config import ConfigError
from pcl.reward.verdict import last_boxed
from pcl.data.rows import read_file, read_hf


@dataclass(frozen=True)
class Fields:
    prompt: str
    answer: str
    id: str | None = None
    answer_in_solution: bool = False  # the answer is the last \boxed{} of this field


@dataclass(frozen=True)
class KnownDataset:
    name: str  # the short name
    hub: str  # the Hugging Face dataset
    split: str  # its split
    hub_fields: Fields
    file: str | None = None  # the local copy's file name under the data root
    file_fields: Fields | None = None
    k: int = 1  # the paper's avg@k when evaluated (AIME and AMC: 32, Minerva: 4, the rest: 1)
    config: str | None = None  # the Hugging Face configuration, for datasets with several
    revision: str | None = None  # the hub revision read when data.revision is unset (None: the newest)


KNOWN = {d.name: d for d in [
    KnownDataset("math", "DigitalLearningGmbH/MATH-lighteval", "train",
                 Fields("problem", "solution", answer_in_solution=True),
                 "math_train.jsonl", Fields("problem", "answer")),
    KnownDataset("deepscaler", "agentica-org/DeepScaleR-Preview-Dataset", "train", Fields("problem", "answer")),
    KnownDataset("math500", "HuggingFaceH4/MATH-500", "test", Fields("problem", "answer", "unique_id"),
                 "math500.jsonl", Fields("problem", "answer", "unique_id"), k=1),
    KnownDataset("aime24", "HuggingFaceH4/aime_2024", "train", Fields("problem", "answer", "id"),
                 "aime24.jsonl", Fields("problem", "answer", "id"), k=32),
    KnownDataset("aime25", "math-ai/aime25", "test", Fields("problem", "answer", "id"),
                 "aime25.jsonl", Fields("problem", "answer", "id"), k=32),
    KnownDataset("amc23", "math-ai/amc23", "test", Fields("question", "answer", "id"),
                 "amc23.jsonl", Fields("problem", "answer", "id"), k=32),
    KnownDataset("minerva", "math-ai/minervamath", "test", Fields("question", "answer"),
                 "minerva_math.jsonl", Fields("problem", "answer", "idx"), k=4),
    # English, text-only, open-ended competition maths: the configuration the evaluations use (its one split)
    KnownDataset("olympiadbench", "Hothan/OlympiadBench", "train", Fields("question", "final_answer", "id"),
                 "olympiadbench.jsonl", Fields("question", "final_answer", "id"), k=1,
                 config="OE_TO_maths_en_COMP"),
]}
BY_HUB = {d.hub.lower(): d for d in KNOWN.values()}


def lookup(source: str) -> KnownDataset | None:
    """The known dataset a `data.source` names (short or Hugging Face name), or None."""
    return KNOWN.get(source.lower()) or BY_HUB.get(source.lower())


def data_root(configured: str | None = None) -> Path | None:
    root = configured  # data.root; the config loader fills it from PCL_DATA_ROOT when the config leaves it unset
    return Path(root).expanduser() if root else None


def local_copy(known: KnownDataset, root: Path | None) -> Path | None:
    if root is None or known.file is None:
        return None
    path = root / known.file
    return path if path.is_file() else None


def fields_for(known: KnownDataset, root: Path | None) -> Fields:
    return known.file_fields if local_copy(known, root) is not None else known.hub_fields


def read_known(known: KnownDataset, root: Path | None, revision: str | None = None) -> list[dict]:
    """The rows of a known dataset: its local copy under root when there is one, else the hub at `revision`
    (default: the dataset's pinned revision, if any)."""
    path = local_copy(known, root)
    if path is not None:
        rows = read_file(path)
    else:
        try:
            rows = read_hf(known.hub, known.split, known.config, revision or known.revision)
        except (ImportError, ValueError) as exc:
            where = f"; no {known.file} under data root {root}" if known.file and root else (
                f"; or set data.root / PCL_DATA_ROOT to a directory holding {known.file}" if known.file else "")
            raise ConfigError(f"dataset {known.name!r} ({known.hub}): {exc}{where}") from None
    fields = fields_for(known, root)
    if fields.answer_in_solution:
        rows = [_with_boxed_answer(row, fields.answer) for row in rows]
    return rows


def _with_boxed_answer(row: dict, field: str) -> dict:
    if type(row) is not dict or not isinstance(row.get(field), str):  # unreadable rows stay as they are
        return row
    return {**row, field: last_boxed(row[field])}
