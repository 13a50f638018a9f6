"""The training set's fingerprint (pcl.data.fingerprint): the same records give the same one; an edited answer, an
edited question, a reordering, a renamed id or another count are each named."""

from __future__ import annotations

import json

from pcl.data.prompts import PromptRecord
from pcl.data.fingerprint import data_fingerprint, fingerprint_differences


def records(n: int = 6) -> list[PromptRecord]:
    return [PromptRecord(str(i), f"{i}+{i}", str(2 * i), f"{i}+{i}=", None) for i in range(n)]


def differences(changed: list[PromptRecord]) -> list[str]:
    saved = json.loads(json.dumps(data_fingerprint(records())))  # through JSON, as state.json holds it
    return fingerprint_differences(saved, data_fingerprint(changed))


def test_the_same_records_match_and_the_fingerprint_is_small():
    assert differences(records()) == []
    assert len(json.dumps(data_fingerprint(records(10_000)))) < 1000


def test_an_edited_answer_or_question_is_named():
    edited = records()
    edited[3] = PromptRecord("3", "3+3", "7", "3+3=", None)
    assert differences(edited) == ["the gold answers differ (an answer edited, or answers moved to other rows)"]
    edited[3] = PromptRecord("3", "3+4", "6", "3+4=", None)
    assert differences(edited) == ["the questions differ (a question edited, or questions moved to other rows)"]
    edited[3] = PromptRecord("3", "3+3", 6, "3+3=", None)  # a number where the text was: another gold answer
    assert differences(edited)[0].startswith("the gold answers differ")


def test_a_reordering_is_named_whether_ids_are_fields_or_row_positions():
    swapped = records()
    swapped[0], swapped[1] = swapped[1], swapped[0]
    assert "in another order (rows reordered)" in differences(swapped)[0]
    # Row-position ids: the rows' contents move under fixed ids; named as moved answers and questions.
    positional = [PromptRecord(str(i), r.problem, r.answer, r.prompt, None) for i, r in enumerate(swapped)]
    found = differences(positional)
    assert any("answers moved to other rows" in d for d in found)
    assert any("questions moved to other rows" in d for d in found)


def test_another_count_or_renamed_ids_are_named():
    assert differences(records(7)) == ["the training set has 7 usable prompts; the checkpoint's had 6"]
    renamed = records()
    renamed[2] = PromptRecord("x2", "2+2", "4", "2+2=", None)
    assert differences(renamed) == ["the prompt ids differ (rows added, removed or renamed at the same count)"]


def test_a_checkpoint_fingerprint_of_version_1_is_still_accepted():
    """Checkpoints written before the `prompts` part (version 1) resume on the same data, and are refused on
    edited data by the parts they hold."""
    from pcl.data.fingerprint import data_changes

    old = {k: v for k, v in data_fingerprint(records()).items() if k != "prompts"} | {"version": 1}
    state = {"num_prompts": 6, "seed": 0, "epoch": 0, "cursor": 2, "data": json.loads(json.dumps(old))}
    assert data_changes(state, records()) == []
    edited = records()
    edited[3] = PromptRecord("3", "3+3", "7", "3+3=", None)
    assert data_changes(state, edited) == ["the gold answers differ (an answer edited, or answers moved to other rows)"]
    assert data_changes({k: v for k, v in state.items() if k != "data"}, edited) == []  # no fingerprint: count only
    assert data_changes(state, records(7)) == ["the training set has 7 usable prompts; the checkpoint's had 6"]


def test_a_template_change_keeps_the_checkpoint_but_not_the_reference_cache():
    from pcl.data.fingerprint import data_changes, same_prompts

    retemplated = [PromptRecord(r.id, r.problem, r.answer, f"Q: {r.prompt}", None) for r in records()]
    state = {"num_prompts": 6, "data": data_fingerprint(records())}
    assert data_changes(state, retemplated) == []  # the sampler's position indexes rows, not their template
    assert same_prompts(data_fingerprint(records()), list(reversed(records())))
    assert not same_prompts(data_fingerprint(records()), retemplated)


def test_an_old_reference_cache_is_still_used(tmp_path):
    """A reference cache written with the old digest (sha256 over the (id, templated prompt) pairs in id order)
    is used for the same prompts, and not for others."""
    import hashlib

    from pcl.data.reference_rates import load_reference

    digest = hashlib.sha256()
    for pid, text in sorted((r.id, r.prompt) for r in records()):
        digest.update(f"{pid}\0{text}\0".encode())
    rates = {r.id: 0.5 for r in records()}
    path = tmp_path / "reference_pass_rates.json"
    path.write_text(json.dumps({"policy": "tiny", "n_pre": 4, "prompts": 6, "fingerprint": digest.hexdigest(),
                                "pass_rates": rates}))
    assert load_reference(path, "tiny", records(), 4) == rates
    changed = records()
    changed[0] = PromptRecord("0", "0+0", "0", "0+0=?", None)
    assert load_reference(path, "tiny", changed, 4) is None
