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
