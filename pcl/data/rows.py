"""Reading raw rows: a local .jsonl / .json / .parquet file, a Hugging Face dataset (offline-aware), or the tiny
task. `pcl.data.prompts` turns rows into prompt records; `pcl.data.datasets` reads the known benchmarks through here.

    rows = load_rows("train.jsonl")   # a list of dicts; unreadable JSON records are `UnreadableRow`s
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pcl.config import TINY_SOURCES, ConfigError, DataConfig

log = logging.getLogger(__name__)

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")

class UnreadableRow(dict):
    """A record of a file that is not a JSON object (invalid JSON, or an array / number / string).

    It stays in the row list, empty, so that later rows keep their positions (their default ids), and
    build_prompts counts it as bad under `where` ("line 7" of a JSONL file, "item 7" of a JSON array).
    """

    def __init__(self, where: str, reason: str):
        super().__init__()
        self.where = where
        self.reason = reason


# ---------------------------------------------------------------------------------------------------------
# Reading rows


def load_rows(source: str, split: str = "train", *, size: int | None = None, seed: int = 0,
              revision: str | None = None) -> list[dict]:
    """The raw rows of a source: a tiny task ("tiny", "tiny-carry"), a .jsonl / .json / .parquet path, or a Hugging Face dataset name
    (or a local folder of data files, which `datasets` reads).

    `split` picks the Hugging Face split (and the tiny task's), `revision` the hub revision; `size` and `seed`
    only apply to "tiny"
    (default size: DataConfig.tiny_size). Unreadable JSON records come back as `UnreadableRow`s.
    """
    if source in TINY_SOURCES:
        from pcl.tiny.tasks import make_dataset  # late: only tiny runs need it

        return make_dataset(source, size=DataConfig().tiny_size if size is None else size, seed=seed, split=split)
    path = Path(source).expanduser()
    if path.is_file():
        return read_file(path)
    if path.is_dir():  # a folder of data files: `datasets` reads those as a dataset
        return read_hf(source, split)
    if path.suffix.lower() in FILE_SUFFIXES or source.startswith(("/", "./", "../", "~")):
        raise FileNotFoundError(f"dataset file {source!r} does not exist (looked at {path.resolve()})")
    return read_hf(source, split, revision=revision)


def read_hf(name: str, split: str, config: str | None = None, revision: str | None = None) -> list[dict]:
    """The rows of a Hugging Face dataset (`config` its configuration, when it has several) at `revision` (a
    commit sha, tag or branch; None: the newest).

    The hub is probed first, once per process and endpoint, with a short timeout: when it cannot be
    reached (or HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set) the dataset is read in offline mode, from the
    local Hugging Face cache only, so an unreachable hub costs seconds and a ConfigError, not minutes of
    retries.
    """
    try:
        import datasets  # late and optional: the `hf` extra
    except ImportError:
        raise ImportError(
            f"data source {name!r} is not an existing file, so it is read as a Hugging Face dataset, which "
            "needs the `datasets` package: pip install 'pcl-service[hf]'"
        ) from None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    if Path(name).expanduser().is_dir():  # a local folder of data files: no hub involved
        offline = None
    elif _offline_env(datasets):
        offline = "offline mode is on (HF_HUB_OFFLINE)"
    else:
        offline = _hub_unreachable(endpoint)
    try:
        with _hub_offline(datasets, offline is not None):
            pinned = {"revision": revision} if revision else {}
            dataset = datasets.load_dataset(name, config, split=split, **pinned)
    except Exception as exc:  # the hub, the cache and the builders raise many types
        where = f" (configuration {config!r})" if config else ""
        where += f" (revision {revision!r})" if revision else ""
        why = f"{type(exc).__name__}: {exc}"
        if offline is not None:
            why = (f"the Hugging Face hub {endpoint} was not used: {offline}; and the local Hugging Face "
                   f"cache has no copy ({why})")
        raise ConfigError(
            f"data source {name!r} is neither an existing file ({', '.join(FILE_SUFFIXES)}) nor a loadable "
            f"Hugging Face dataset{where} with split {split!r}: {why}"
        ) from exc
    return [dict(row) for row in dataset]


_HUB_PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "on", "yes", "true"}


def _offline_env(datasets: Any) -> bool:
    flags = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(flag, "").strip().lower() in _TRUE for flag in flags) or bool(
        getattr(datasets.config, "HF_HUB_OFFLINE", False))


@functools.lru_cache(maxsize=8)
def _hub_unreachable(endpoint: str) -> str | None:
    """None when the hub answers (any HTTP status, through the environment's proxies), else why not."""
    try:
        request = urllib.request.Request(endpoint, method="HEAD")
        with urllib.request.urlopen(request, timeout=_HUB_PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections, a malformed endpoint
        return f"it could not be reached within {_HUB_PROBE_TIMEOUT_S:g} s ({getattr(exc, 'reason', exc)})"


@contextlib.contextmanager
def _hub_offline(datasets: Any, offline: bool) -> Iterator[None]:
    """`datasets` and `huggingface_hub` in offline mode for the duration (their flags are read at import,
    so setting the environment variable later has no effect). Loads run in the driver, one at a time."""
    if not offline:
        yield
        return
    import huggingface_hub.constants as hub_constants

    targets = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
               (hub_constants, "HF_HUB_OFFLINE")]
    saved = [(module, attr, getattr(module, attr)) for module, attr in targets if hasattr(module, attr)]
    for module, attr, _ in saved:
        setattr(module, attr, True)
    try:
        yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)


def read_file(path: Path) -> list[dict]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix not in (".jsonl", ".json"):
        raise ValueError(f"dataset file {str(path)!r}: unsupported type {suffix!r}; use {FILE_SUFFIXES}")
    # surrogateescape keeps undecodable bytes as lone surrogates, so one bad byte costs its row (caught
    # in build_prompts when it sits in a field we use), not the whole file.
    text = path.read_bytes().removeprefix(b"\xef\xbb\xbf").decode("utf-8", "surrogateescape")
    if suffix == ".json" and text.lstrip().startswith("["):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"dataset file {str(path)!r} is not valid JSON: {exc}") from None
        rows = [_as_row(f"item {i}", value) for i, value in enumerate(values)]
    else:
        rows = [_parse_line(n, line) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]
    if rows and all(isinstance(row, UnreadableRow) for row in rows):
        raise ValueError(
            f"dataset file {str(path)!r} has no JSON object rows; expected JSON Lines or a JSON array of "
            f"objects ({rows[0].where}: {rows[0].reason})"
        )
    return rows


def _parse_line(number: int, line: str) -> dict:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        return UnreadableRow(f"line {number}", f"not valid JSON ({exc.msg})")
    return _as_row(f"line {number}", value)


def _as_row(where: str, value: Any) -> dict:
    if isinstance(value, dict):
        return value
    return UnreadableRow(where, f"a JSON {type(value).__name__}, not an object")


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"dataset file {str(path)!r} is not a readable Parquet file: {exc}") from None
    return table.to_pylist()
