"""Datasets by name (pcl.data.datasets): short and Hugging Face names, local copies under the data root with their
own field mapping, answers taken from a solution's last \\boxed{}, and a clear error when neither a local copy
nor the hub can be had."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pcl.config import ConfigError, DataConfig
from pcl.data.prompts import load_prompts
from pcl.data.datasets import KNOWN, Fields, lookup, read_known

MATH = Path(__file__).resolve().parents[3] / "shared" / "data" / "math"


def test_short_and_hub_names_are_the_same_dataset():
    assert lookup("math500") is lookup("HuggingFaceH4/MATH-500") is lookup("huggingfaceh4/math-500")
    assert lookup("agentica-org/DeepScaleR-Preview-Dataset").name == "deepscaler"
    assert lookup("DigitalLearningGmbH/MATH-lighteval").name == "math"
    assert lookup("some/other-dataset") is None and lookup("./rows.jsonl") is None


def test_the_math_training_set_by_name_from_the_data_root(monkeypatch):
    from pcl.config import load_config

    monkeypatch.setenv("PCL_DATA_ROOT", str(MATH))  # data.root unset: the config loader takes it from here
    records, report = load_prompts(load_config(None, ["data.source=math", "data.template=qwen_base"]).data)
    assert (report.total, report.kept, report.skipped_empty_answer) == (7474, 7470, 4)
    by_hub, _ = load_prompts(DataConfig(source="DigitalLearningGmbH/MATH-lighteval", root=str(MATH)))
    assert [r.id for r in by_hub] == [r.id for r in records]


def test_a_solution_field_yields_its_last_boxed_answer(tmp_path):
    row = {"problem": "1+1?", "solution": r"First \boxed{3} is wrong; so $\boxed{\frac{4}{2}}$."}
    known = KNOWN["math"]
    # The hub's mapping of MATH-lighteval: the answer is inside the solution.
    assert known.hub_fields.answer_in_solution and not known.file_fields.answer_in_solution
    from pcl.data.datasets import _with_boxed_answer

    assert _with_boxed_answer(row, "solution")["solution"] == r"\frac{4}{2}"
    assert _with_boxed_answer({"problem": "x", "solution": None}, "solution")["solution"] is None


def test_no_local_copy_and_no_hub_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("PCL_DATA_ROOT", raising=False)
    with pytest.raises(ValueError, match="dataset 'math500' \\(HuggingFaceH4/MATH-500\\)") as err:
        read_known(KNOWN["math500"], tmp_path)  # an empty data root
    assert "math500.jsonl" in str(err.value)


# Rows of each local copy (/work/shared/data/math/README.md); every one has a question and an answer.
BENCHMARKS = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272, "olympiadbench": 675}


@pytest.mark.parametrize("name,rows", BENCHMARKS.items())
def test_each_benchmark_loads_by_name_from_the_data_root(name, rows):
    records, report = load_prompts(DataConfig(source=name, root=str(MATH), template="plain"))
    assert (report.total, report.kept) == (rows, rows)
    assert len({r.id for r in records}) == rows  # the registry's id field (or the row position) is unique
    for record in records:
        assert record.problem.strip() and record.prompt == record.problem
        answers = record.answer if isinstance(record.answer, list) else [record.answer]
        assert answers and all(str(a).strip() for a in answers)
    if name == "olympiadbench":
        assert all(isinstance(r.answer, list) for r in records)  # final_answer: a list of acceptable texts
    if name == "math500":
        assert records[0].id == "test/precalculus/807.json"  # unique_id, as on the hub


def test_boxed_answers_of_real_math_solutions_match_the_gold_answers():
    # MATH500 is drawn from the MATH test split in MATH-lighteval's format: a worked `solution` next to the
    # gold `answer`. Read with the lighteval mapping (answer = the solution's last \boxed{}), every row must
    # give the recorded gold answer.
    as_lighteval = replace(KNOWN["math500"], file_fields=Fields("problem", "solution", "unique_id",
                                                                answer_in_solution=True))
    extracted = read_known(as_lighteval, MATH)
    gold = [json.loads(line) for line in (MATH / "math500.jsonl").read_text().splitlines()]
    assert len(extracted) == len(gold) == 500
    assert [row["solution"] for row in extracted] == [row["answer"] for row in gold]


def _offline(monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("PCL_DATA_ROOT", raising=False)
    return datasets


def test_an_unknown_name_offline_is_a_quick_config_error_naming_it(monkeypatch):
    _offline(monkeypatch)
    start = time.monotonic()
    with pytest.raises(ConfigError, match="'no-such-org/no-such-set'") as err:
        load_prompts(DataConfig(source="no-such-org/no-such-set"))
    assert time.monotonic() - start < 15
    assert "offline mode is on" in str(err.value) and "split 'train'" in str(err.value)


def test_an_unreachable_hub_is_a_quick_config_error_and_offline_mode_is_restored(monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants as hub_constants

    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as sock:  # a port nothing listens on: connections are refused at once
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    start = time.monotonic()
    named = r"dataset 'deepscaler' \(agentica-org/DeepScaleR-Preview-Dataset\)"
    with pytest.raises(ConfigError, match=named) as err:
        load_prompts(DataConfig(source="deepscaler"))
    assert time.monotonic() - start < 15  # not the hub client's minutes of retries
    assert f"hub {endpoint} was not used" in str(err.value) and "no copy" in str(err.value)
    assert datasets.config.HF_HUB_OFFLINE is False and hub_constants.HF_HUB_OFFLINE is False


def test_olympiadbench_is_read_from_the_hub_with_its_configuration(monkeypatch):
    datasets = _offline(monkeypatch)
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return [{"id": 1, "question": "q", "final_answer": ["2"], "solution": ["..."]}]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    records, _ = load_prompts(DataConfig(source="olympiadbench", template="plain"))
    assert calls == [("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train")]
    assert (records[0].id, records[0].answer) == ("1", ["2"])


def test_data_revision_pins_the_hub_read_and_is_named_in_errors(monkeypatch):
    datasets = _offline(monkeypatch)
    calls = []

    def load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split, kwargs))
        if kwargs.get("revision") == "no-such-rev":
            raise FileNotFoundError("revision not found")
        return [{"problem": "1+1", "answer": "2"}]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    load_prompts(DataConfig(source="deepscaler", template="plain", revision="0123abcd"))
    load_prompts(DataConfig(source="some-org/some-set", template="plain", revision="v1.0"))
    load_prompts(DataConfig(source="some-org/some-set", template="plain"))  # unpinned: the hub's newest
    assert calls == [("agentica-org/DeepScaleR-Preview-Dataset", None, "train", {"revision": "0123abcd"}),
                     ("some-org/some-set", None, "train", {"revision": "v1.0"}),
                     ("some-org/some-set", None, "train", {})]
    with pytest.raises(ConfigError, match=r"'some-org/some-set'.*\(revision 'no-such-rev'\)"):
        load_prompts(DataConfig(source="some-org/some-set", template="plain", revision="no-such-rev"))
