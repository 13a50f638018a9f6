"""The one fingerprint of a prompt set: kept in each checkpoint (a resume on other data is refused) and in each
reference pass-rate cache (a cache made for other prompts is not used).

    saved = data_fingerprint(records)                  # in the checkpoint (state.json, the sampler's state)
    problems = data_changes(sampler_state, records)    # [] when the saved position fits these records
    same_prompts(cache["fingerprint"], records)        # a reference cache made for these prompts (any order)

The sampler's saved position (epoch, cursor) indexes the training set in its order: the same position in an
edited or reordered set of the same size means other prompts. The fingerprint is order-sensitive over the
prompt ids, questions and gold answers; its parts say what differs: the count, the ids, the order of the same
rows, the answers, the questions. Each part is a SHA-256 digest (64 hex characters), so the checkpoint stays
small for any dataset size. The `prompts` part covers the templated prompt texts by id in any order: a
reference pass rate depends on the text the policy saw (the tiny task's prompts depend on the run seed), the
sampler's position does not (a resume may change the template).

Older fingerprints are still read: a checkpoint's of version 1 (no `prompts` part) is compared on the parts it
has; a reference cache's single digest (sha256 over the (id, templated prompt) pairs in id order) is compared
with `legacy_prompts_digest`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

VERSION = 2
READ_VERSIONS = (1, 2)  # version 1: written before the `prompts` part, compared without it


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
    """JSON-ready fingerprint of prompt records (anything with `.id`, `.problem`, `.answer`, `.prompt`), in their
    order."""
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
        "prompts": _digest(sorted(_digest([i, str(r.prompt)]) for i, r in zip(ids, records))),  # by id, any order
    }


def legacy_prompts_digest(records: Iterable[Any]) -> str:
    """The digest a reference cache held before it kept `data_fingerprint`: sha256 over the (id, templated
    prompt) pairs in id order. Read only, so that older caches stay valid."""
    digest = hashlib.sha256()
    for pid, text in sorted((r.id, r.prompt) for r in records):
        digest.update(f"{pid}\0{text}\0".encode())
    return digest.hexdigest()


def same_prompts(saved: dict[str, Any] | str, records: Sequence[Any]) -> bool:
    """Whether a reference cache's fingerprint (`data_fingerprint`, or an older cache's digest) was made for
    these records: the same rows (ids, questions, answers) and templated prompts, in any order."""
    if isinstance(saved, str):
        return saved == legacy_prompts_digest(records)
    now = data_fingerprint(records)
    return isinstance(saved, dict) and all(saved.get(k) == now[k] for k in ("count", "rows", "prompts"))


def fingerprint_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between the checkpoint's training set (`saved`) and this run's (`now`), one phrase each."""
    if saved.get("ordered") == now["ordered"] and saved.get("count") == now["count"]:
        return []
    if saved.get("version") not in READ_VERSIONS:
        return [f"the checkpoint's data fingerprint has version {saved.get('version')!r}, not one of {READ_VERSIONS}"]
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


def data_changes(sampler_state: dict[str, Any], records: Sequence[Any]) -> list[str]:
    """The training-data check, the one rule: what makes a saved sampler position (`PromptSampler.state_dict`,
    with the fingerprint under "data") meaningless on `records`, one phrase each; [] when it fits. A state
    without a fingerprint (checkpoints written before it) is checked by its prompt count only."""
    count = sampler_state.get("num_prompts")
    if count is not None and count != len(records):
        return [f"the training set has {len(records)} usable prompts; the checkpoint's had {count}"]
    if "data" not in sampler_state:
        return []
    return fingerprint_differences(sampler_state["data"], data_fingerprint(records))
