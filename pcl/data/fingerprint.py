"""The fingerprint of a training set, kept in each checkpoint so that a resume on other data is refused.

    saved = data_fingerprint(records)                 # in the checkpoint (state.json, the sampler's state)
    problems = fingerprint_differences(saved, data_fingerprint(records_now))   # [] when the data is the same

The sampler's saved position (epoch, cursor) indexes the training set in its order: the same position in an
edited or reordered set of the same size means other prompts. The fingerprint is order-sensitive over the
prompt ids, questions and gold answers; its parts say what differs: the count, the ids, the order of the same
rows, the answers, the questions. Each part is a SHA-256 digest (64 hex characters), so the checkpoint stays
small for any dataset size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

VERSION = 1


def _digest(items: Iterable[str]) -> str:
    h = hashlib.sha256()
    for item in items:
        data = item.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))  # length-prefixed: no two sequences hash the same bytes
        h.update(data)
    return h.hexdigest()


def _answer_text(answer: Any) -> str:
    return json.dumps(answer, sort_keys=True, ensure_ascii=False)  # "3" and 3 differ, as math-verify sees them


def data_fingerprint(records: Sequence[Any]) -> dict[str, Any]:
    """JSON-ready fingerprint of prompt records (anything with `.id`, `.problem`, `.answer`), in their order."""
    ids = [str(r.id) for r in records]
    answers = [_answer_text(r.answer) for r in records]
    problems = [str(r.problem) for r in records]
    rows = sorted(_digest([i, p, a]) for i, p, a in zip(ids, problems, answers))
    return {
        "version": VERSION,
        "count": len(records),
        "ordered": _digest(_digest([i, p, a]) for i, p, a in zip(ids, problems, answers)),
        "ids": _digest(ids),  # in order
        "id_set": _digest(sorted(ids)),
        "answers": _digest(answers),  # in order
        "problems": _digest(problems),  # in order
        "rows": _digest(rows),  # the same rows in any order
    }


def fingerprint_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between the checkpoint's training set (`saved`) and this run's (`now`), one phrase each."""
    if saved.get("ordered") == now["ordered"] and saved.get("count") == now["count"]:
        return []
    if saved.get("version") != now["version"]:
        return [f"the checkpoint's data fingerprint has version {saved.get('version')!r}, not {now['version']}"]
    if saved["count"] != now["count"]:
        return [f"the training set has {now['count']} usable prompts; the checkpoint's had {saved['count']}"]
    if saved["rows"] == now["rows"]:
        return [(f"the training set holds the same {now['count']} prompts and answers in another order (rows "
                 "reordered): the saved sampler position would pick other prompts")]
    problems = []
    if saved["id_set"] != now["id_set"]:
        problems.append("the prompt ids differ (rows added, removed or renamed at the same count)")
    elif saved["ids"] != now["ids"]:
        problems.append("the prompt ids are in another order")
    if saved["answers"] != now["answers"]:
        problems.append("the gold answers differ (an answer edited, or answers moved to other rows)")
    if saved["problems"] != now["problems"]:
        problems.append("the questions differ (a question edited, or questions moved to other rows)")
    return problems or ["the training set differs from the checkpoint's"]
