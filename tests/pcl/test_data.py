"""Datasets and templates on the real math files: field mappings, skipped rows and their counts, hostile
files (bad JSON, bad UTF-8, a 1 MB prompt, garbage), Parquet, and the prompt templates."""

import json
import sys
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, processors
from transformers import PreTrainedTokenizerFast

from pcl.config import DataConfig
from pcl.data.prompts import build_prompts, load_prompts, load_rows
from pcl.data.templates import QWEN_BASE_INSTRUCTION, apply_template

MATH = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


@pytest.fixture
def math_dir() -> Path:
    if not (MATH / "math_train.jsonl").is_file():
        pytest.skip(f"shared math data not found at {MATH}")
    return MATH


def char_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII and newline; others -> <unk>), <bos> prepended on encode.

    A BPE model without merges and without a pre-tokenizer splits text into single characters, fast enough
    for a 1 MB prompt.
    """
    specials = ["<unk>", "<bos>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(specials + chars)}, merges=[], unk_token="<unk>"))
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<bos>",
                                  extra_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = chat_template
    return tok


# ---------------------------------------------------------------------------------------------------------
# The real math files


def test_math_train_skips_null_and_empty_answers_with_one_warning(math_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="pcl.data.prompts"):
        records, report = load_prompts(DataConfig(source=str(math_dir / "math_train.jsonl")))
    assert (report.total, report.kept, report.skipped_empty_answer) == (7474, 7470, 4)
    assert report.skipped == 4 and len(records) == 7470
    # Rows 886 and 1009 have a null answer, 5328 and 5330 an empty one.
    assert report.first_skipped_ids == ["886", "1009", "5328", "5330"]
    assert not report.length_checked and "not checked" in report.summary()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "886" in warnings[0].getMessage() and "skipped 4 of 7474" in warnings[0].getMessage()
    first = records[0]
    assert first.id == "0" and first.answer == "0" and first.prompt_token_ids is None
    assert first.prompt == f"{first.problem} {INSTRUCTION}"


def test_amc23_float_answers_survive(math_dir):
    records, report = load_prompts(DataConfig(source=str(math_dir / "amc23.jsonl"), id_field="id"))
    assert report.kept == 40 and report.skipped == 0
    assert records[0].id == "0" and records[0].answer == 27.0 and isinstance(records[0].answer, float)
    assert records[15].answer == -1.0


def test_olympiadbench_final_answer_lists(math_dir):
    cfg = DataConfig(source=str(math_dir / "olympiadbench.jsonl"), prompt_field="question",
                     answer_field="final_answer", id_field="id")
    records, report = load_prompts(cfg)
    assert report.kept == 675 and report.skipped == 0
    assert records[0].id == "1606" and records[0].answer == ["2"]
    assert all(isinstance(r.answer, list) and r.answer for r in records)


def test_wrong_answer_field_names_the_fields_present(math_dir):
    cfg = DataConfig(source=str(math_dir / "olympiadbench.jsonl"), prompt_field="question")
    with pytest.raises(ValueError, match="no usable row") as err:
        load_prompts(cfg)
    assert "final_answer" in str(err.value) and "answer_field='answer'" in str(err.value)


@pytest.mark.parametrize("name, id_field, count, first_answer", [
    ("minerva_math.jsonl", "idx", 272, "1.6"),
    ("math500.jsonl", "unique_id", 500, r"\left( 3, \frac{\pi}{2} \right)"),
    ("aime24.jsonl", "id", 30, "204"),
    ("aime25.jsonl", "id", 30, "70"),
])
def test_eval_sets_load_whole(math_dir, name, id_field, count, first_answer):
    records, report = load_prompts(DataConfig(source=str(math_dir / name), id_field=id_field, template="plain"))
    assert report.kept == count == len({r.id for r in records})
    assert records[0].answer == first_answer and records[0].prompt == records[0].problem


def test_eval_side_reads_eval_source(math_dir):
    cfg = DataConfig(source=str(math_dir / "math_train.jsonl"), eval_source=str(math_dir / "math500.jsonl"))
    records, _ = load_prompts(cfg, split="eval")
    assert len(records) == 500
    with pytest.raises(ValueError, match="eval_source is not set"):
        load_prompts(DataConfig(source=str(math_dir / "amc23.jsonl")), split="eval")


def test_prompt_length_checked_with_a_tokenizer(math_dir):
    tok = char_tokenizer()
    cfg = DataConfig(source=str(math_dir / "math500.jsonl"), template="plain", max_prompt_tokens=200)
    records, report = load_prompts(cfg, tok)
    rows = load_rows(str(math_dir / "math500.jsonl"))
    # One token per character plus <bos>: the expected count follows from the character lengths.
    fitting = sum(len(row["problem"]) + 1 <= 200 for row in rows)
    assert report.length_checked and report.kept == fitting and report.skipped_too_long == 500 - fitting > 0
    assert all(len(r.prompt_token_ids) <= 200 and r.prompt_token_ids[0] == 1 for r in records)


# ---------------------------------------------------------------------------------------------------------
# Hostile and other file forms


def test_hostile_jsonl_is_skipped_and_counted(tmp_path, caplog):
    lines = [
        b'{"id": "a", "problem": "1+1", "answer": "2"}',
        b"not json at all",
        b"[1, 2]",
        b'{"id": "c", "problem": "bad \xff byte", "answer": "3"}',
        json.dumps({"id": "d", "problem": "x" * 1_000_000, "answer": "4"}).encode(),
        b'{"id": "e", "problem": 42, "answer": "5"}',
        b'{"id": "f", "problem": "nan answer", "answer": NaN}',
        b'{"id": "g", "answer": "1"}',
        b'{"id": "h", "problem": "fine", "solution": "bad \xfe byte elsewhere", "answer": "8"}',
        b"",
        b'{"id": "i", "problem": "lone \\ud800 escape", "answer": "1"}',
        b'{"id": "j", "problem": "list", "answer": ["", "7"]}',
        b'{"id": "k", "problem": "empty list", "answer": []}',
    ]
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    cfg = DataConfig(source=str(path), id_field="id", template="plain", max_prompt_tokens=1024)
    with caplog.at_level(logging.WARNING, logger="pcl.data.prompts"):
        records, report = load_prompts(cfg, char_tokenizer())
    assert [r.id for r in records] == ["a", "h", "j"]
    assert records[2].answer == ["7"] and records[0].prompt_token_ids == (1, 4 + ord("1") - 32, 4 + ord("+") - 32, 4 + ord("1") - 32)
    assert (report.total, report.kept, report.skipped_bad, report.skipped_empty_answer,
            report.skipped_missing, report.skipped_too_long) == (12, 3, 5, 2, 1, 1)
    assert report.first_skipped_ids == ["line 2", "line 3", "c", "e", "f"]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_long_prompt_is_never_truncated(tmp_path):
    path = tmp_path / "edge.jsonl"
    path.write_text("\n".join(json.dumps({"problem": p, "answer": "1"}) for p in ["abc", "abcd"]))
    records, report = load_prompts(DataConfig(source=str(path), template="plain", max_prompt_tokens=4), char_tokenizer())
    # "abc" is 4 tokens with <bos> (exactly the limit): kept whole; "abcd" is 5: skipped, not cut.
    assert [r.prompt for r in records] == ["abc"] and len(records[0].prompt_token_ids) == 4
    assert report.skipped_too_long == 1 and report.first_skipped_ids == ["1"]


@pytest.mark.parametrize("name, content, message", [
    ("garbage.jsonl", bytes(range(256)) * 16, "no JSON object rows"),
    ("garbage.json", b"[1, 2", "not valid JSON"),
    ("garbage.parquet", b"this is not parquet", "not a readable Parquet file"),
    ("table.csv", b"a,b\n1,2\n", "unsupported type"),
])
def test_garbage_files_are_clear_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        load_rows(str(path))
    assert str(path) in str(err.value)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_rows(str(missing))


def test_json_array_and_parquet(tmp_path):
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([{"problem": "p0", "answer": 3}, 5, {"problem": "p2", "answer": "x"}]))
    records, report = load_prompts(DataConfig(source=str(array), template="plain"))
    assert [(r.id, r.answer) for r in records] == [("0", 3), ("2", "x")]
    assert report.skipped_bad == 1 and report.first_skipped_ids == ["item 1"]

    table = pa.table({"uid": [10, 11, 12, 13], "problem": ["1+1", "2+2", "3+3", None],
                      "answer": [2.0, float("nan"), 6.0, 8.0]})
    parquet = tmp_path / "rows.parquet"
    pq.write_table(table, parquet)
    records, report = load_prompts(DataConfig(source=str(parquet), id_field="uid", template="plain"))
    assert [(r.id, r.problem, r.answer) for r in records] == [("10", "1+1", 2.0), ("12", "3+3", 6.0)]
    assert (report.skipped_empty_answer, report.skipped_missing) == (1, 1)


def test_duplicate_ids_are_an_error(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": 1, "problem": "a", "answer": "1"}\n{"id": 1, "problem": "b", "answer": "2"}\n')
    with pytest.raises(ValueError, match="id_field=null"):
        load_prompts(DataConfig(source=str(path), id_field="id"))


def test_hub_name_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as on an install without the `hf` extra
    with pytest.raises(ImportError, match=r"pip install 'pcl-service\[hf\]'") as err:
        load_rows("HuggingFaceH4/MATH-500", split="test")
    assert "HuggingFaceH4/MATH-500" in str(err.value)


def test_hub_names_and_folders_with_datasets_installed(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ValueError, match="neither an existing file") as err:
        load_rows("no-such-org/no-such-dataset", split="test")
    assert "no-such-org/no-such-dataset" in str(err.value)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    assert load_rows(str(folder), split="train") == [{"problem": "1+1", "answer": "2"}]


def test_tiny_source_uses_the_tiny_task():
    pytest.importorskip("pcl.tiny.task")
    cfg = DataConfig(source="tiny", template="tiny", tiny_size=32, eval_source="tiny", eval_size=16)
    train, _ = load_prompts(cfg, seed=3)
    held_out, _ = load_prompts(cfg, split="eval", seed=3)
    assert len(train) == 32 and len(held_out) == 16
    assert train[0].prompt == train[0].problem + "=" and str(sum(map(int, train[0].problem.split("+")))) == train[0].answer
    assert not {r.problem for r in train} & {r.problem for r in held_out}


# ---------------------------------------------------------------------------------------------------------
# Templates


def test_qwen_base_and_plain_templates():
    assert QWEN_BASE_INSTRUCTION == INSTRUCTION
    assert apply_template("What is $1+1$?", "qwen_base") == "What is $1+1$? " + INSTRUCTION
    assert apply_template("What is $1+1$?", "plain") == "What is $1+1$?"
    with pytest.raises(ValueError, match="unknown prompt template 'alpaca'"):
        apply_template("q", "alpaca")


def test_tiny_template_delegates():
    pytest.importorskip("pcl.tiny.task")
    assert apply_template("12+345", "tiny") == "12+345="


def test_chat_template_one_user_turn_with_generation_prompt(tmp_path):
    tok = char_tokenizer(CHAT_TEMPLATE)
    text = apply_template("What is 2+3?", "chat", tok)
    assert text == f"<|im_start|>user\nWhat is 2+3? {INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"problem": "What is 2+3?", "answer": "5"}) + "\n")
    [record], _ = load_prompts(DataConfig(source=str(path), template="chat"), tok)
    # The chat text carries its own special tokens: no <bos> is added, <|im_start|> is one token (id 2).
    assert record.prompt == text and record.prompt_token_ids[0] == 2 and 1 not in record.prompt_token_ids
    content = f"What is 2+3? {INSTRUCTION}"
    assert len(record.prompt_token_ids) == 1 + len("user\n") + len(content) + 2 + 1 + len("assistant\n")


def test_chat_template_needs_one():
    with pytest.raises(ValueError, match="has no chat template"):
        apply_template("q", "chat", char_tokenizer())
    with pytest.raises(ValueError, match="needs a tokenizer"):
        apply_template("q", "chat", None)
