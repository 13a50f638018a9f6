"""The evaluation suite: avg@k arithmetic, k and suite parsing, the benchmarks by name on the real files, and
`pcl eval` end to end with the tiny model (its scores are near 0: the counts, k and the averaging are tested)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pcl import evaluation as ev

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
    for bad in ("aime24=0", "nope=3", "aime24=x"):
        with pytest.raises(ValueError):
            ev.parse_k(bad, names)
    assert ev.parse_suite("MATH500, aime24,math500") == ["math500", "aime24"]
    with pytest.raises(ValueError, match="the suite has"):
        ev.parse_suite("math500,gsm8k")


@pytest.mark.parametrize("name, count", [("math500", 500), ("aime24", 30), ("aime25", 30), ("amc23", 40),
                                         ("minerva", 272), ("olympiadbench", 675)])
def test_benchmarks_load_by_name_from_the_data_root(name, count):
    suite = ev.load_suite([name], None, "qwen_base", root=str(MATH))
    records = suite[name]
    assert len(records) == count == len({r.id for r in records})
    assert all(r.id.startswith(f"{name}/") and r.answer not in (None, "", []) for r in records)
    assert records[0].prompt.endswith("within \\boxed{}.")
    assert len(ev.load_suite([name], None, "plain", root=str(MATH), limit=3)[name]) == 3


def test_pcl_eval_end_to_end_with_the_tiny_model(tmp_path):
    from pcl.tiny.build import build_tiny

    build_tiny(seed=0)
    out = tmp_path / "eval"
    run = subprocess.run([sys.executable, "-m", "services.cli", "eval", "--model", "tiny", "--suite",
                          "math500,aime24,amc23", "--limit", "3", "--k", "aime24=4,amc23=2", "--max-new-tokens", "8",
                          "--data-root", str(MATH), "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads((out / "eval.json").read_text())
    got = {b["name"]: b for b in data["benchmarks"]}
    assert {n: (b["k"], b["prompts"], b["samples"]) for n, b in got.items()} == {
        "math500": (1, 3, 3), "aime24": (4, 3, 12), "amc23": (2, 3, 6)}
    for b in got.values():
        assert b["avg_at_k"] == pytest.approx(sum(b["per_prompt"].values()) / b["prompts"])
        assert 0.0 <= b["avg_at_k"] <= 1.0
    assert data["average"] == pytest.approx(sum(b["avg_at_k"] for b in got.values()) / 3)
    assert data["temperature"] == 0.6 and data["top_p"] == 0.95 and data["top_k"] == 20
    assert "| aime24 | 4 | 3 | 12 |" in (out / "eval.md").read_text()
    assert "average" in run.stdout and "aime24" in run.stdout


def test_pcl_eval_names_bad_input(tmp_path):
    def fail(*args):
        run = subprocess.run([sys.executable, "-m", "services.cli", "eval", *args], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        return run.stderr

    assert "gsm8k" in fail("--model", "tiny", "--suite", "gsm8k")
    assert "no such model directory" in fail("--model", str(tmp_path / "none"), "--suite", "math500")
    assert "aime24=0" in fail("--model", "tiny", "--suite", "aime24", "--k", "aime24=0")
