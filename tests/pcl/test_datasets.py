"""Datasets by name (pcl.datasets): short and Hugging Face names, local copies under the data root with their
own field mapping, answers taken from a solution's last \\boxed{}, and a clear error when neither a local copy
nor the hub can be had."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcl.config import DataConfig
from pcl.data import load_prompts
from pcl.datasets import KNOWN, lookup, read_known

MATH = Path(__file__).resolve().parents[3] / "shared" / "data" / "math"


def test_short_and_hub_names_are_the_same_dataset():
    assert lookup("math500") is lookup("HuggingFaceH4/MATH-500") is lookup("huggingfaceh4/math-500")
    assert lookup("agentica-org/DeepScaleR-Preview-Dataset").name == "deepscaler"
    assert lookup("DigitalLearningGmbH/MATH-lighteval").name == "math"
    assert lookup("some/other-dataset") is None and lookup("./rows.jsonl") is None


def test_the_math_training_set_by_name_from_the_data_root(monkeypatch):
    monkeypatch.setenv("PCL_DATA_ROOT", str(MATH))
    records, report = load_prompts(DataConfig(source="math", template="qwen_base"))
    assert (report.total, report.kept, report.skipped_empty_answer) == (7474, 7470, 4)
    by_hub, _ = load_prompts(DataConfig(source="DigitalLearningGmbH/MATH-lighteval", root=str(MATH)))
    assert [r.id for r in by_hub] == [r.id for r in records]


def test_a_solution_field_yields_its_last_boxed_answer(tmp_path):
    row = {"problem": "1+1?", "solution": r"First \boxed{3} is wrong; so $\boxed{\frac{4}{2}}$."}
    known = KNOWN["math"]
    # The hub's mapping of MATH-lighteval: the answer is inside the solution.
    assert known.hub_fields.answer_in_solution and not known.file_fields.answer_in_solution
    from pcl.datasets import _with_boxed_answer

    assert _with_boxed_answer(row, "solution")["solution"] == r"\frac{4}{2}"
    assert _with_boxed_answer({"problem": "x", "solution": None}, "solution")["solution"] is None


def test_no_local_copy_and_no_hub_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("PCL_DATA_ROOT", raising=False)
    with pytest.raises(ValueError, match="dataset 'math500' \\(HuggingFaceH4/MATH-500\\)") as err:
        read_known(KNOWN["math500"], tmp_path)  # an empty data root
    assert "math500.jsonl" in str(err.value)
