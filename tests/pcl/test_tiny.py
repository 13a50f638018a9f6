"""The tiny task: tokenizer, dataset, and the `pcl make-tiny` build (fast variant; the full one is `slow`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pcl.reward.verdict import math_reward
from pcl.tiny import build, measure
from pcl.tiny.build import MARKER, build_tiny, summarize, tiny_dir
from pcl.tiny.task import LEVELS, format_prompt, make_dataset, split_of
from pcl.tiny.tokenizer import VOCAB, build_tokenizer

# ---------------------------------------------------------------------------------------------------------
# Tokenizer


def test_tokenizer_round_trip_and_auto_load(tmp_path):
    from transformers import AutoTokenizer

    build_tokenizer().save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 18
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    # <bos> first, one id per character, no <eos> appended to a prompt; whitespace is dropped.
    assert tokenizer("12+345=").input_ids == [1, 5, 6, 14, 7, 8, 9, 17]
    assert tokenizer(" 12 + 345 = ").input_ids == tokenizer("12+345=").input_ids
    answer = tokenizer("357", add_special_tokens=False).input_ids + [tokenizer.eos_token_id, 0, 0]
    assert tokenizer.decode(answer, skip_special_tokens=True) == "357"
    assert tokenizer.decode(tokenizer("9*8-7=").input_ids, skip_special_tokens=True) == "9*8-7="
    assert tokenizer("7x").input_ids == [1, VOCAB["7"], VOCAB["<unk>"]]


def test_tokenizer_pads_on_the_left_for_generation():
    batch = build_tokenizer()(["1+2=", "12+3="], padding=True)
    assert batch.input_ids[0] == [0, 1, 5, 14, 6, 17]
    assert batch.attention_mask[0] == [0, 1, 1, 1, 1, 1]


# ---------------------------------------------------------------------------------------------------------
# Task


def test_dataset_rows_are_correct_additions_with_their_level():
    rows = make_dataset(300, seed=1, split="train")
    assert rows[7]["id"] == "tiny-train-000007"
    for row in rows:
        a, b = row["problem"].split("+")
        assert row["answer"] == str(int(a) + int(b))
        assert sorted((len(a), len(b))) == sorted(LEVELS[row["difficulty"] - 1])
        assert math_reward(row["answer"], row["answer"]) == 1.0
    assert {row["difficulty"] for row in rows} == set(range(1, len(LEVELS) + 1))
    assert format_prompt("12+345") == "12+345="


def test_dataset_is_deterministic_and_prefix_stable():
    first = make_dataset(500, seed=3, split="eval")
    assert make_dataset(500, seed=3, split="eval") == first
    assert make_dataset(200, seed=3, split="eval") == first[:200]
    assert make_dataset(500, seed=4, split="eval") != first


def test_train_and_eval_splits_are_disjoint():
    def pairs(rows):
        return {tuple(sorted(int(x) for x in r["problem"].split("+"))) for r in rows}

    train, held_out = pairs(make_dataset(4000, 0, "train")), pairs(make_dataset(1000, 0, "eval"))
    assert train and held_out and not train & held_out
    assert split_of(3, 5) == split_of(5, 3)


def test_training_problems_are_unique_while_a_level_has_unused_ones():
    rows = [r for r in make_dataset(2000, 0, "train") if r["difficulty"] >= 3]
    assert len({r["problem"] for r in rows}) == len(rows)


@pytest.mark.parametrize(
    "size, seed, split, message",
    [(-1, 0, "train", "size"), (10, 0, "test", "split"), (10, "0", "train", "seed"),
     (True, 0, "train", "size")],
)
def test_bad_dataset_arguments_are_named(size, seed, split, message):
    with pytest.raises(ValueError, match=message):
        make_dataset(size, seed, split)
    with pytest.raises(ValueError, match="problem"):
        format_prompt("")


# ---------------------------------------------------------------------------------------------------------
# Build


def test_summarize_pins_histogram_mean_and_intermediate_share():
    rates = [0.0, 0.0625, 0.1, 0.5, 0.9, 0.9375, 1.0, 0.25]
    summary = summarize(rates, [1, 1, 2, 2, 3, 3, 3, 7])
    assert summary["histogram"] == [2, 1, 1, 0, 0, 1, 0, 0, 0, 3]
    assert summary["mean"] == pytest.approx(3.75 / 8)
    assert summary["intermediate_share"] == pytest.approx(4 / 8)  # 0.1, 0.5, 0.9, 0.25
    level_3 = {"name": "2+2 digits", "prompts": 3, "mean": pytest.approx(2.8375 / 3)}
    assert summary["by_difficulty"]["3"] == level_3


def test_tiny_dir_follows_pcl_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PCL_CACHE", str(tmp_path))
    assert tiny_dir(5) == tmp_path / "tiny" / "seed-5"


@pytest.fixture(scope="module")
def quick_builds(tmp_path_factory) -> tuple[Path, Path]:
    """Two quick builds (3 warm-up steps, 8 measured prompts) of the same seed in different directories."""
    root = tmp_path_factory.mktemp("tiny_builds")
    return tuple(build_tiny(seed=2, out_dir=root / name, steps=3, measure_prompts=8) for name in ("a", "b"))


def test_quick_build_loads_and_generates(quick_builds):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = quick_builds[0]
    for name in (MARKER, "report.json", "train.jsonl", "eval.jsonl", "config.json", "tokenizer.json"):
        assert (path / name).is_file(), name
    assert not [p for p in path.parent.iterdir() if ".building-" in p.name]  # staging dirs are gone
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "qwen3" and 0.5e6 < model.num_parameters() < 10e6
    rows = [json.loads(line) for line in (path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == build.TRAIN_SIZE and rows == make_dataset(build.TRAIN_SIZE, 2, "train")
    encoded = tokenizer([format_prompt(r["problem"]) for r in rows[:4]], padding=True, return_tensors="pt")
    output = model.generate(**encoded, do_sample=True, max_new_tokens=6)
    assert output.shape[0] == 4 and output.shape[1] > encoded.input_ids.shape[1]
    report = json.loads((path / "report.json").read_text())
    assert report["warmup_steps"] == 3 and report["pass_rates"]["prompts"] == 8
    assert sum(report["pass_rates"]["histogram"]) == 8


def test_build_is_deterministic_for_a_seed(quick_builds):
    from safetensors.torch import load_file

    first, second = (load_file(path / "model.safetensors") for path in quick_builds)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    reports = [json.loads((path / "report.json").read_text()) for path in quick_builds]
    assert reports[0]["final_loss"] == reports[1]["final_loss"]
    assert reports[0]["pass_rates"] == reports[1]["pass_rates"]


def test_complete_build_is_reused_unless_forced(quick_builds, capsys):
    path = quick_builds[0]
    before = (path / MARKER).stat().st_mtime_ns
    assert build_tiny(seed=2, out_dir=path, steps=3, measure_prompts=8) == path
    assert (path / MARKER).stat().st_mtime_ns == before
    assert capsys.readouterr().out == ""  # verbose=False prints nothing
    build_tiny(seed=2, out_dir=path, steps=3, measure_prompts=8, force=True, verbose=True)
    assert (path / MARKER).stat().st_mtime_ns != before
    assert "warm-up step" in capsys.readouterr().out


def test_build_with_other_settings_is_not_mistaken_for_the_cached_one(quick_builds):
    with pytest.raises(ValueError, match="force=True"):
        build_tiny(seed=3, out_dir=quick_builds[1], steps=3, measure_prompts=8)
    with pytest.raises(ValueError, match="warmup_steps"):
        build_tiny(seed=2, out_dir=quick_builds[1], steps=4, measure_prompts=8)


def test_warm_up_stops_at_the_first_probe_reaching_the_target(tmp_path):
    report = json.loads((build_tiny(seed=2, out_dir=tmp_path / "t", steps=6, measure_prompts=8, target_pass_rate=0.0,
                                    probe_from=2, probe_every=2) / "report.json").read_text())
    assert report["warmup_steps_taken"] == 2 and len(report["loss_by_tenth"]) == 2
    assert [p["step"] for p in report["probes"]] == [2]


def test_probes_that_never_reach_the_target_leave_the_warm_up_unchanged(tmp_path):
    from safetensors.torch import load_file

    probed = build_tiny(seed=2, out_dir=tmp_path / "probed", steps=6, measure_prompts=8, target_pass_rate=1.0,
                        probe_from=2, probe_every=2)
    plain = build_tiny(seed=2, out_dir=tmp_path / "plain", steps=6, measure_prompts=8, target_pass_rate=None)
    report = json.loads((probed / "report.json").read_text())
    assert report["warmup_steps_taken"] == 6 and [p["step"] for p in report["probes"]] == [2, 4]
    assert all(0.0 <= p["pass_rate"] < 1.0 for p in report["probes"])
    first, second = load_file(probed / "model.safetensors"), load_file(plain / "model.safetensors")
    assert all(torch.equal(first[name], second[name]) for name in first)  # the probes sample on a forked RNG
    assert json.loads((plain / "report.json").read_text())["probes"] == []


def test_a_build_of_an_older_format_is_rebuilt(tmp_path, capsys):
    path = build_tiny(seed=2, out_dir=tmp_path / "t", steps=2, measure_prompts=4)
    marker = json.loads((path / MARKER).read_text())
    (path / MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k != "format"}))
    assert build_tiny(seed=2, out_dir=path, steps=2, measure_prompts=4) == path
    assert "older format: rebuilding" in capsys.readouterr().out
    assert json.loads((path / MARKER).read_text()) == marker


def test_unreadable_marker_means_incomplete(tmp_path):
    (tmp_path / MARKER).write_text("seed 0\n")  # not the marker a build writes
    assert not build.is_complete(tmp_path) and not build.is_complete(tmp_path / "absent")


def test_staging_left_by_a_killed_build_is_removed(tmp_path):
    import os

    stale, fresh = tmp_path / ".tiny.building-old", tmp_path / ".tiny.building-new"
    stale.mkdir(), fresh.mkdir()
    os.utime(stale, (0, 0))  # untouched for decades: its build is dead
    build_tiny(seed=0, out_dir=tmp_path / "tiny", steps=1, measure_prompts=1)
    assert not stale.exists() and fresh.exists()  # a recent one may belong to a running build
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny.building-new", "tiny"]


def test_bad_build_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="seed"):
        build_tiny(seed=-1, out_dir=tmp_path)
    with pytest.raises(ValueError, match="steps"):
        build_tiny(seed=0, out_dir=tmp_path, steps=0)
    with pytest.raises(ValueError, match="measure_prompts"):
        build_tiny(seed=0, out_dir=tmp_path, measure_prompts=5000)
    with pytest.raises(ValueError, match="target_pass_rate"):
        build_tiny(seed=0, out_dir=tmp_path, target_pass_rate=1.5)
    with pytest.raises(ValueError, match="probe_every"):
        build_tiny(seed=0, out_dir=tmp_path, probe_every=0)
    assert not any(tmp_path.iterdir())  # nothing was built


@pytest.mark.slow
def test_full_build_spreads_pass_rates(tmp_path):
    """The real build: at least 30% of prompts with 0.1 <= p <= 0.9 and a mean pass rate in [0.2, 0.7]; the
    warm-up stops once a probe reaches the target, or runs all its steps."""
    built = build_tiny(seed=0, out_dir=tmp_path / "tiny", from_scratch=True)
    report = json.loads((built / "report.json").read_text())
    probes = report["probes"]
    assert probes and all(p["pass_rate"] < build.TARGET_PASS_RATE for p in probes[:-1])
    if report["warmup_steps_taken"] < report["warmup_steps"]:
        assert probes[-1]["pass_rate"] >= build.TARGET_PASS_RATE
        assert report["warmup_steps_taken"] == probes[-1]["step"]
    rates = report["pass_rates"]
    assert rates["prompts"] == 512
    assert rates["intermediate_share"] >= 0.30, rates
    assert 0.2 <= rates["mean"] <= 0.7, rates
    by_level = rates["by_difficulty"]
    assert by_level["1"]["mean"] > 0.8 and by_level["7"]["mean"] < 0.5, by_level  # easy and hard both occur


def test_carry_solution_writes_each_column_then_the_sum():
    from pcl.tiny.carry import solution

    assert solution("487+356") == "7+6=13,8+5+1=14,4+3+1=8,\\boxed{843}"
    assert solution("7+6") == "7+6=13,\\boxed{13}"
    assert solution("999999+999999").count("+1=") == 5 and solution("999999+999999").endswith(",\\boxed{1999998}")
    with pytest.raises(ValueError, match="487"):
        solution("487-356")


def test_carry_dataset_levels_splits_and_reward():
    from pcl.reward.verdict import math_reward
    from pcl.tiny import carry

    rows = carry.make_dataset(600, seed=0, split="train")
    assert rows == carry.make_dataset(600, seed=0, split="train") and rows[:100] == carry.make_dataset(100, 0, "train")
    assert {r["difficulty"] for r in rows} == set(carry.LEVELS)
    for row in rows:
        a, b = row["problem"].split("+")
        assert len(a) == len(b) == row["difficulty"] and int(a) + int(b) == int(row["answer"])
        assert split_of(int(a), int(b)) == "train"
    # the answers the warm-up teaches score 1 with the project's reward, a wrong last digit 0
    for row in rows[:50]:
        assert math_reward(carry.solution(row["problem"]), row["answer"]) == 1.0
        assert math_reward(carry.solution(row["problem"])[:-2] + "}", row["answer"]) == 0.0  # last digit dropped
        if row["difficulty"] > 1:  # a scratchpad without its box: no column's sum is the answer
            assert math_reward(carry.solution(row["problem"]).split("\\boxed")[0], row["answer"]) == 0.0
    held_out = carry.make_dataset(300, seed=0, split="eval")
    assert not {r["problem"] for r in held_out} & {r["problem"] for r in carry.make_dataset(4000, 0, "train")}
    # the warm-up's own stream leans to short additions
    warm = carry.make_dataset(3000, seed=0, split="train", weights=carry.WARMUP_WEIGHTS, stream="warmup")
    assert sum(r["difficulty"] <= 2 for r in warm) > 2 * sum(r["difficulty"] >= 5 for r in warm)


def test_task_families_are_the_tiny_sources_and_fit_their_tokenizer():
    from pcl.config import TINY_SOURCES
    from pcl.tiny.tasks import TASKS, make_dataset as family_rows, tiny_task

    assert tuple(TASKS) == TINY_SOURCES
    assert family_rows("tiny", 50, 0, "train") == make_dataset(50, 0, "train")  # the arithmetic task unchanged
    for name in TINY_SOURCES:
        family = tiny_task(name)
        tokenizer = build_tokenizer(family.symbols, family.max_positions)
        for row in family.train_rows(200, 0):
            ids = tokenizer(format_prompt(row["problem"]) + family.response(row)).input_ids
            assert tokenizer.unk_token_id not in ids and len(ids) + 1 <= family.max_positions
            assert tokenizer.decode(ids, skip_special_tokens=True) == format_prompt(row["problem"]) + family.response(row)
    assert len(build_tokenizer()) == len(VOCAB)  # the arithmetic task's vocabulary as before
    with pytest.raises(ValueError, match="tiny-carry"):
        tiny_task("nope")


def test_quick_carry_build_has_its_own_tokenizer_rows_and_cache(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    from pcl.tiny import carry

    monkeypatch.setenv("PCL_CACHE", str(tmp_path))
    path = build_tiny(seed=1, steps=3, measure_prompts=8, target_pass_rate=None, task="tiny-carry")
    assert path == tiny_dir(1, "tiny-carry") == tmp_path / "tiny-carry" / "seed-1"
    assert json.loads((path / MARKER).read_text())["task"] == "tiny-carry"
    rows = [json.loads(line) for line in (path / "train.jsonl").read_text().splitlines()]
    assert rows == carry.make_dataset(build.TRAIN_SIZE, 1, "train")
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer("487+356=" + carry.solution("487+356"), add_special_tokens=False).input_ids
    assert len(ids) == len("487+356=7+6=13,8+5+1=14,4+3+1=8,") + 1 + len("843}")  # "\boxed{" is one token
    assert tokenizer.decode(ids) == "487+356=" + carry.solution("487+356")
    assert AutoConfig.from_pretrained(path).max_position_embeddings == 128
    report = json.loads((path / "report.json").read_text())
    assert report["task"] == "tiny-carry" and set(report["pass_rates"]["by_difficulty"]) <= {"1", "2", "3", "4", "5", "6"}


def test_measure_pass_rates_takes_a_task_response_over_several_chunks():
    """Regression: the per-sample loop once reused the name of the `response` argument, so a second chunk of
    prompts called a list."""
    from transformers import Qwen3ForCausalLM

    from pcl.tiny.tasks import CARRY

    torch = pytest.importorskip("torch")
    tokenizer = build_tokenizer(CARRY.symbols, CARRY.max_positions)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(build.policy_config(tokenizer, CARRY.max_positions)).eval()
    rows = CARRY.train_rows(5, 0)
    rates = measure.measure_pass_rates(model, tokenizer, rows, samples=2, seed=0, batch_prompts=2,
                                     response=CARRY.response)
    assert len(rates) == 5 and all(r in (0.0, 0.5, 1.0) for r in rates)
