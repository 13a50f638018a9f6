"""The evaluation suite: avg@k arithmetic, k parsing, the plan read from a run config, the data root, the benchmarks
by name on the real files, scoring (truncation, batching) with a real reward pool, and `pcl eval` end to end with the
tiny model (its scores are near 0: the counts, k and the averaging are tested)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcl import benchmarks as ev
from pcl.config import load_config

REPO = Path(__file__).resolve().parents[2]
MATH = REPO.parent / "shared" / "data" / "math"


def test_avg_at_k_is_the_mean_of_per_prompt_means():
    assert ev.avg_at_k([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]) == pytest.approx((0.25 + 1 + 0) / 3)
    assert ev.avg_at_k([[1], [0]]) == 0.5
    with pytest.raises(ValueError):
        ev.avg_at_k([])
    r = ev.summarize("aime24", 2, {"a": [1.0, 0.0], "b": [0.0, 0.0]}, truncated=1)
    assert (r.prompts, r.samples, r.avg_at_k, r.solved_any, r.per_prompt) == (2, 4, 0.25, 1, {"a": 0.5, "b": 0.0})
    with pytest.raises(ValueError, match="expected 2 samples"):
        ev.summarize("aime24", 2, {"a": [1.0]})


def test_paper_defaults_and_overrides_of_k():
    names = list(ev.SUITE)
    assert ev.parse_k(None, names) == {"math500": 1, "aime24": 32, "aime25": 32, "amc23": 32, "minerva": 4,
                                       "olympiadbench": 1}
    assert set(ev.parse_k("2", names).values()) == {2}
    assert ev.parse_k("aime24=8,math500=3", ["math500", "aime24"]) == {"math500": 3, "aime24": 8}
    assert ev.parse_k("aime24=8,2", ["math500", "aime24", "minerva"]) == {"math500": 2, "aime24": 8, "minerva": 2}
    assert ev.parse_k({"aime24": 8}, ["aime24", "amc23"]) == {"aime24": 8, "amc23": 32}
    assert ev.parse_k(3, ["minerva"]) == ev.parse_k("aime24=5,3", ["minerva"]) == {"minerva": 3}
    for bad in ("aime24=0", "nope=3", "aime24=x", "0", "-1", "two"):
        with pytest.raises(ValueError):
            ev.parse_k(bad, names)


def test_the_plan_takes_every_default_from_the_evaluation_section():
    plan = ev.eval_plan(load_config(None))
    assert plan.names == list(ev.SUITE) and plan.ks == ev.parse_k(None, list(ev.SUITE))  # empty suite: all six
    assert plan.sampling == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert plan.max_new_tokens == load_config(None).rollout.max_new_tokens  # evaluation.max_new_tokens unset
    plan = ev.eval_plan(load_config(None, ["evaluation.suite=[aime24,math500]", "evaluation.k={aime24: 8}",
                                           "evaluation.temperature=1.0", "evaluation.max_new_tokens=64"]))
    assert (plan.names, plan.ks, plan.sampling["temperature"], plan.max_new_tokens) == (
        ["aime24", "math500"], {"aime24": 8, "math500": 1}, 1.0, 64)
    with pytest.raises(ValueError, match="evaluation.k: unknown benchmark 'gsm8k'"):
        ev.eval_plan(load_config(None, ["evaluation.k={gsm8k: 2}"]))


def test_data_root_defaults_to_the_shared_data_beside_the_repo(monkeypatch, tmp_path):
    monkeypatch.delenv("PCL_DATA_ROOT", raising=False)
    assert ev.eval_data_root(None) == str(MATH)  # shared/data holds the files in math/
    assert ev.eval_data_root(str(MATH.parent)) == ev.eval_data_root(str(MATH)) == str(MATH)
    monkeypatch.setenv("PCL_DATA_ROOT", str(tmp_path))  # data.root unset: the config loader takes it from here
    assert ev.eval_data_root(load_config(None).data.root) == str(tmp_path)
    assert ev.default_out_dir("runs/q/checkpoints/step-000120/policy", "/x/runs/q/checkpoints/step-000120/policy") \
        == Path("evals/q-step-000120")
    assert ev.default_out_dir("tiny", "/c/pcl/tiny/seed-0") == Path("evals/tiny")
    assert ev.default_out_dir("Qwen/Qwen3-4B-Base", "Qwen/Qwen3-4B-Base") == Path("evals/Qwen3-4B-Base")


@pytest.mark.parametrize("name, count", [("math500", 500), ("aime24", 30), ("aime25", 30), ("amc23", 40),
                                         ("minerva", 272), ("olympiadbench", 675)])
def test_benchmarks_load_by_name_from_the_data_root(name, count):
    suite = ev.load_suite([name], None, "qwen_base", root=str(MATH))
    records = suite[name]
    assert len(records) == count == len({r.id for r in records})
    assert all(r.id.startswith(f"{name}/") and r.answer not in (None, "", []) for r in records)
    assert records[0].prompt.endswith("within \\boxed{}.")
    assert len(ev.load_suite([name], None, "plain", root=str(MATH), limit=3)[name]) == 3


class ScriptedEngine:
    """Answers prompt i with `responses[i]` (text, finish_reason) for every sample; records each call's size."""

    def __init__(self, responses):
        self.responses, self.calls = responses, []

    def generate(self, prompt_token_ids, params):
        from pcl.engines.base import Generation

        self.calls.append((len(prompt_token_ids), params.n, params.seed, params.top_k))
        return [[Generation(i, j, [1], *self.responses[ids[0]], 1) for j in range(params.n)]
                for i, ids in enumerate(prompt_token_ids)]


def test_evaluate_scores_with_math_verify_and_zeroes_truncated_responses():
    sampling = ev.eval_plan(load_config(None)).sampling  # the paper's: temperature 0.6, top_p 0.95, top_k 20
    from pcl.data.prompts import PromptRecord
    from pcl.reward.pool import RewardPool

    golds = ["5", "\\frac{1}{2}", "7", "3"]
    records = [PromptRecord(f"aime24/{i}", "q", gold, "q", (i,)) for i, gold in enumerate(golds)]
    engine = ScriptedEngine([("so \\boxed{5}", "stop"), ("\\boxed{0.5}", "stop"), ("\\boxed{7}", "length"),
                             ("\\boxed{4}", "stop")])
    with RewardPool(processes=1, timeout_s=10) as pool:
        [result] = ev.evaluate(engine, pool, {"aime24": records}, {"aime24": 3}, sampling, 16, seed=5,
                               batch_size=7, progress=False)
    # 0.5 == 1/2 for math-verify; the right answer cut off by the length limit scores 0
    assert result.per_prompt == {"aime24/0": 1.0, "aime24/1": 1.0, "aime24/2": 0.0, "aime24/3": 0.0}
    assert (result.prompts, result.samples, result.truncated, result.timeouts, result.solved_any) == (4, 12, 3, 0, 2)
    assert result.avg_at_k == 0.5
    # 7 sequences per call at k=3: 2 prompts per call, seeds derived from the first prompt of each call
    assert engine.calls == [(2, 3, 5, 20), (2, 3, 7, 20)]


def test_pcl_eval_end_to_end_with_the_tiny_model(tiny_model, tmp_path):
    out = tmp_path / "eval"
    env = {key: value for key, value in os.environ.items() if key != "PCL_DATA_ROOT"}  # the default data root
    run = subprocess.run([sys.executable, "-m", "entrypoints.cli", "eval", "model.path=tiny",
                          "evaluation.suite=[math500,aime24,amc23]", "evaluation.limit=3",
                          "evaluation.k={math500: 2, aime24: 4, amc23: 2}", "--out", str(out),
                          "evaluation.max_new_tokens=8"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads((out / "eval.json").read_text())
    got = {b["name"]: b for b in data["benchmarks"]}
    assert {n: (b["k"], b["prompts"], b["samples"]) for n, b in got.items()} == {
        "math500": (2, 3, 6), "aime24": (4, 3, 12), "amc23": (2, 3, 6)}
    for b in got.values():
        assert b["avg_at_k"] == pytest.approx(sum(b["per_prompt"].values()) / b["prompts"])
        assert 0.0 <= b["avg_at_k"] <= 1.0
    assert data["average"] == pytest.approx(sum(b["avg_at_k"] for b in got.values()) / 3)
    assert data["temperature"] == 0.6 and data["top_p"] == 0.95 and data["top_k"] == 20
    assert data["engine"] == "hf" and data["data_root"] == str(MATH) and data["max_new_tokens"] == 8
    assert "| aime24 | 4 | 3 | 12 |" in (out / "eval.md").read_text()
    lines = run.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("benchmark")):]
    assert table[0].split() == ["benchmark", "k", "prompts", "samples", "avg@k", "solved", "trunc", "t/o"]
    assert [line.split()[:4] for line in table[2:5]] == [["math500", "2", "3", "6"], ["aime24", "4", "3", "12"],
                                                         ["amc23", "2", "3", "6"]]
    assert table[5].split()[0] == "average" and f"wrote {out / 'eval.json'}" in run.stdout


def test_pcl_eval_names_bad_input(tmp_path):
    def fail(*args):
        run = subprocess.run([sys.executable, "-m", "entrypoints.cli", "eval", *args], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        return run.stderr

    assert "'evaluation.suite.0'" in (err := fail("model.path=tiny", "evaluation.suite=[gsm8k]")) and "gsm8k" in err
    assert "no such model directory" in fail(f"model.path={tmp_path / 'none'}", "evaluation.suite=[math500]")
    assert "'evaluation.k.aime24' = 0 is out of range" in fail("evaluation.suite=[aime24]", "evaluation.k={aime24: 0}")
    assert "evaluation.k: unknown benchmark 'gsm8k'" in fail("evaluation.k={gsm8k: 2}")
    assert "'evaluation.limit' = 0 is out of range" in fail("evaluation.suite=[aime24]", "evaluation.limit=0")
    assert "has no config.json" in fail(f"model.path={tmp_path}", "evaluation.suite=[math500]")
    # the config file and overrides of `pcl train`, with its errors
    assert "unknown key 'evaluation.temperatur'" in fail("configs/tiny.yaml", "evaluation.temperatur=0.7")
    assert "override 'tiny': expected key=value" in fail("tiny")
    assert "unrecognized arguments: --k" in fail("--k", "8")  # the settings are the config's, not flags
    if importlib.util.find_spec("vllm") is None:
        assert "vLLM is not installed" in fail("evaluation.suite=[aime24]", "rollout.engine=vllm")



def test_accuracy_with_se_is_the_sampling_error_on_the_prompts():
    import numpy as np

    from pcl.benchmarks import accuracy_with_se

    accuracy, se = accuracy_with_se([[1, 1], [0, 0], [1, 0], [0, 1]])
    # prompts 3 and 4: variance 0.5 over 2 samples each; prompts 1 and 2 add nothing
    assert accuracy == 0.5 and se == pytest.approx(np.sqrt(0.5 / 2 + 0.5 / 2) / 4)
    assert accuracy_with_se([[1, 1, 1, 1], [0, 0, 0, 0]])[1] == 0.0  # always or never solved: no sampling noise
    assert np.isnan(accuracy_with_se([[1.0], [0.0]])[1])  # one sample a prompt: unknown
    # 4x the samples halve it
    assert accuracy_with_se([[1, 0] * 8] * 10)[1] == pytest.approx(accuracy_with_se([[1, 0] * 2] * 10)[1] / 2, rel=0.15)
