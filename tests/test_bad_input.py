"""Bad input to `pcl train`, through the real command line: each case ends in a non-zero exit and a message naming
the input, with no traceback, before any actor starts (no Ray, no Redis for configuration problems); unusable
dataset rows are skipped and counted. The unit tests of each check are in tests/pcl/test_config.py,
tests/pcl/test_data.py, tests/services/test_redis_server.py and tests/services/test_control_api.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pcl(*args: str, env: dict | None = None, timeout: float = 120) -> tuple[int, str, float]:
    import os

    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **(env or {})})
    return run.returncode, run.stdout + run.stderr, time.monotonic() - start


def assert_clear_failure(code: int, out: str, *needles: str) -> None:
    assert code != 0, out
    assert "Traceback" not in out, out
    assert "actors up" not in out, out  # failed before any actor started
    for needle in needles:
        assert needle in out, (needle, out)


@pytest.fixture(scope="module")
def tiny():
    from pcl.tiny.build import build_tiny

    return str(build_tiny(seed=0))


@pytest.mark.parametrize("overrides, needles", [
    (["selection.tau=1.5"], ["'selection.tau' = 1.5 is out of range", "<= 1"]),
    (["run.m=0"], ["'run.m' = 0 is out of range"]),
    (["run.steps=many"], ["'run.steps'", "many"]),
    (["rollout.temperatur=0.7"], ["unknown key 'rollout.temperatur'"]),
    (["selection.type=best"], ["'selection.type' is 'best'", "pcl"]),
])
def test_bad_config_values_are_named(overrides, needles, tmp_path):
    code, out, seconds = pcl("train", "configs/tiny.yaml", *overrides, "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(code, out, *needles)
    assert not (tmp_path / "run").exists()  # nothing written for a config that cannot run
    assert seconds < 30


@pytest.mark.parametrize("content, needle", [
    ("run:\n  m: 8\n  colour: blue\n", "unknown key 'run.colour'"),
    ("- just\n- a list\n", "the top level must be a mapping"),
    ("run: {m: [\n", "not valid YAML"),
])
def test_bad_config_files_are_named(content, needle, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    code, out, _ = pcl("train", str(path), "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(code, out, needle, str(path))


def test_missing_config_file(tmp_path):
    code, out, _ = pcl("train", str(tmp_path / "nope.yaml"))
    assert_clear_failure(code, out, "nope.yaml", "does not exist")


def test_missing_model_and_a_directory_that_is_not_a_model(tmp_path):
    code, out, _ = pcl("train", "configs/tiny.yaml", f"model.path={tmp_path / 'gone'}", "--run-dir",
                       str(tmp_path / "r1"))
    assert_clear_failure(code, out, "model.path", "no such model directory")
    (tmp_path / "empty").mkdir()
    code, out, _ = pcl("train", "configs/tiny.yaml", f"model.path={tmp_path / 'empty'}", "--run-dir",
                       str(tmp_path / "r2"))
    assert_clear_failure(code, out, "model.path", "no config.json")


def test_redis_unreachable_at_start(tiny, tmp_path):
    code, out, seconds = pcl("train", "configs/tiny.yaml", "redis.url=redis://:s3cret@127.0.0.1:1/0",
                             "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(code, out, "127.0.0.1:1")
    assert "s3cret" not in out  # the password is masked
    code, out, _ = pcl("train", "configs/tiny.yaml", "--run-dir", str(tmp_path / "run2"),
                       env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert_clear_failure(code, out, "127.0.0.1:1")
    assert seconds < 60


def test_bad_dataset_rows_are_skipped_and_counted(tiny, tmp_path):
    rows = [json.dumps({"problem": "1+1=", "answer": "2"}).encode(),
            json.dumps({"problem": "2+2=", "answer": None}).encode(),          # null answer
            json.dumps({"answer": "3"}).encode(),                               # no question
            json.dumps({"problem": "3+3=", "answer": ""}).encode(),             # empty answer
            b'{"problem": "4+4=\xff\xfe", "answer": "8"}',                       # invalid UTF-8
            json.dumps({"problem": "9" * 1_000_000 + "=", "answer": "1"}).encode(),  # a 1 MB prompt
            b"not json at all",
            json.dumps({"problem": "5+5=", "answer": "10"}).encode()]
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"\n".join(rows) + b"\n")
    code, out, _ = pcl("train", "configs/tiny.yaml", f"data.source={data}", "data.template=plain", "data.id_field=null",
                       "data.eval_source=null",
                       "run.m=4", "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(code, out, "kept 2 of 8 rows", "fewer than run.m=4")
    summary = next(line for line in out.splitlines() if "training set" in line)
    assert "1 without a question" in summary and "2 with a null or empty answer" in summary
    assert "1 too long" in summary and "2 unreadable" in summary


def test_resume_without_a_checkpoint_and_of_an_incomplete_one(tiny, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    code, out, _ = pcl("train", "configs/tiny.yaml", "--run-dir", str(run), "--resume")
    assert_clear_failure(code, out, "no complete checkpoint", str(run))
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    code, out, _ = pcl("train", "configs/tiny.yaml", "--resume", str(run / "checkpoints" / "step-000002"))
    assert_clear_failure(code, out, "incomplete")


def test_an_existing_run_is_not_overwritten(tiny, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    code, out, _ = pcl("train", "configs/tiny.yaml", "--run-dir", str(run))
    assert_clear_failure(code, out, "already holds a run", "--resume")
    assert (run / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_a_dataset_with_no_usable_row_or_no_file(tiny, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "1+1=", "solution": "2"}) + "\n")
    code, out, _ = pcl("train", "configs/tiny.yaml", f"data.source={data}", "data.id_field=null",
                       "data.eval_source=null", "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(code, out, "no usable row", "fields in the data: ['question', 'solution']")
    code, out, _ = pcl("train", "configs/tiny.yaml", f"data.source={tmp_path / 'none.jsonl'}",
                       "data.eval_source=null", "--run-dir", str(tmp_path / "run2"))
    assert_clear_failure(code, out, "none.jsonl")


def test_resume_with_a_config_that_does_not_fit_the_checkpoint(tiny, tmp_path):
    from pcl import checkpoint as ckpt
    from pcl.config import dump_config, load_config

    run = tmp_path / "run"
    tmp = ckpt.begin(run / "checkpoints", 4)
    (tmp / "config.yaml").write_text(dump_config(load_config("configs/tiny.yaml", ["run.seed=5", "run.m=32"])))
    (tmp / "state.json").write_text(json.dumps({"sampler": {"num_prompts": 999}}))
    ckpt.commit(tmp, run / "checkpoints", 4)
    code, out, _ = pcl("train", "configs/tiny.yaml", "--run-dir", str(run), "--resume")
    assert_clear_failure(code, out, "cannot resume from", "run.seed is 0; the checkpoint's run had 5",
                         "run.m is 64; the checkpoint's run had 32", "4096 usable prompts; the checkpoint's had 999")
