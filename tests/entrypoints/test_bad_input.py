"""Bad input to `pcl train`, through the real command line: each case ends in a non-zero exit and a one-line
message on stderr naming the input, with no traceback, before any actor starts (no Ray; no Redis for
configuration problems); unusable dataset rows are skipped and counted. The unit tests of each check are in
tests/pcl/test_config.py, tests/pcl/test_data.py, tests/pcl/test_checkpoint.py,
tests/services/test_redis_server.py and tests/services/test_control_api.py.

Exit codes: 2 for a configuration problem (config, model, data, run dir, checkpoint), 3 for Redis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
# Failing fast: a config, path, run-dir or checkpoint problem is found before any model loads (about 0.5 s on
# an idle 2-core machine); data and Redis problems after loading the tiny model and task (about 5 s idle).
# The limits leave room for a busy machine; training, or a hang, would take far longer.
EARLY_S, LOADED_S = 10.0, 30.0


class Result(NamedTuple):
    code: int
    stdout: str
    stderr: str
    seconds: float


def pcl(*args: str, env: dict | None = None) -> Result:
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "entrypoints.cli", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={**os.environ, **(env or {})})  # a hang fails the test
    return Result(run.returncode, run.stdout, run.stderr, time.monotonic() - start)


def train(*args: str, env: dict | None = None) -> Result:
    """`pcl train configs/tiny.yaml ARGS...`"""
    return pcl("train", "configs/tiny.yaml", *args, env=env)


def assert_clear_failure(result: Result, *needles: str, code: int = 2, one_line: bool = True,
                         limit_s: float = EARLY_S) -> str:
    """The run stopped in preparation with exit `code` and a `pcl: ...` message, the last thing on stderr,
    holding every needle; returns the message."""
    out = result.stdout + result.stderr
    assert result.code == code, out
    assert "Traceback" not in out, out
    assert "actors up" not in out and "Ray instance" not in out, out  # failed before Ray or any actor started
    assert result.seconds < limit_s, (result.seconds, out)
    lines = result.stderr.strip().splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith("pcl: ")), default=None)
    assert start is not None, out
    message = "\n".join(lines[start:])
    if one_line:
        assert start == len(lines) - 1, out
    for needle in needles:
        assert needle in message, (needle, message)
    return message


@pytest.mark.parametrize("overrides, needles", [
    (["selection.tau=1.5"], ["'selection.tau' = 1.5 is out of range", "<= 1"]),
    (["run.m=0"], ["'run.m' = 0 is out of range"]),
    (["run.steps=many"], ["'run.steps'", "valid integer", "many"]),
    (["run.m=true"], ["'run.m'", "valid integer", "True"]),  # strict: a bool is not a count
    (["rollout.temperatur=0.7"], ["unknown key 'rollout.temperatur'"]),
    (["selection.type=best"], ["'selection.type' is 'best'", "pcl"]),
])
def test_bad_config_values_are_named(overrides, needles, tmp_path):
    result = train(*overrides, "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(result, "configs/tiny.yaml + command line", *needles)
    assert not (tmp_path / "run").exists()  # nothing written for a config that cannot run


def test_every_bad_value_is_named_one_line_each(tmp_path):
    result = train("selection.tau=1.5", "run.m=0", "--run-dir", str(tmp_path / "run"))
    message = assert_clear_failure(result, one_line=False)
    assert message.splitlines()[0] == "pcl: invalid configuration:"
    assert sorted(line.split(": ", 1)[1].split(" = ")[0] for line in message.splitlines()[1:]) == [
        "'run.m'", "'selection.tau'"]


@pytest.mark.parametrize("content, needle", [
    ("run:\n  m: 8\n  colour: blue\n", "unknown key 'run.colour'"),
    ("run:\n  m: [8]\n", "'run.m': Input should be a valid integer"),
    ("run: 5\n", "'run': Input should be a valid dictionary"),
    ("- just\n- a list\n", "the top level must be a mapping of sections, got list"),
    ("just a sentence\n", "the top level must be a mapping of sections, got str"),
])
def test_bad_config_files_are_named(content, needle, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert_clear_failure(pcl("train", str(path), "--run-dir", str(tmp_path / "run")), needle, str(path))


def test_a_config_file_that_is_not_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("run: {m: [\n")
    # the parser's position follows on further lines: the message is not one line, but it is the file's
    assert_clear_failure(pcl("train", str(path)), f"pcl: {path}: not valid YAML", one_line=False)


def test_missing_config_file(tmp_path):
    assert_clear_failure(pcl("train", str(tmp_path / "nope.yaml")),
                         f"config file '{tmp_path / 'nope.yaml'}' does not exist")


def test_missing_model_and_a_directory_that_is_not_a_model(tmp_path):
    result = train("model.path=/nonexistent", "--run-dir", str(tmp_path / "r1"))
    assert_clear_failure(result, "model.path = '/nonexistent': no such model directory")
    (tmp_path / "empty").mkdir()
    result = train(f"model.path={tmp_path / 'empty'}", "--run-dir", str(tmp_path / "r2"))
    assert_clear_failure(result, f"model.path = '{tmp_path / 'empty'}'", "no config.json")


def test_a_hub_model_name_that_cannot_be_loaded(tmp_path):
    # A name of the hub's form (org/name) that is neither cached nor reachable: offline mode keeps the test
    # fast (online, transformers' own retries come first).
    result = train("model.path=no-such-org/no-such-model", "--run-dir", str(tmp_path / "r"),
                   env={"HF_HUB_OFFLINE": "1"})
    assert_clear_failure(result, "model.path = 'no-such-org/no-such-model': cannot load a tokenizer",
                         limit_s=LOADED_S)


def test_redis_unreachable_at_start(tiny_model, tmp_path):
    result = train("redis.url=redis://:s3cret@127.0.0.1:1/0", "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(result, "cannot reach Redis at redis://:***@127.0.0.1:1/0", code=3, limit_s=LOADED_S)
    assert "s3cret" not in result.stdout + result.stderr  # the password is masked
    result = train("--run-dir", str(tmp_path / "run2"), env={"REDIS_URL": "redis://u:s3cret@127.0.0.1:1/0"})
    assert_clear_failure(result, "cannot reach Redis at redis://u:***@127.0.0.1:1/0", code=3, limit_s=LOADED_S)
    assert "s3cret" not in result.stdout + result.stderr


def test_a_malformed_redis_url_is_a_config_error(tmp_path):
    """Checked with the config, before the model loads or anything connects; the password masked."""
    result = train("redis.url=redis://:s3cret@127.0.0.1:port/0", "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(result, "'redis.url' = 'redis://:***@127.0.0.1:port/0': its port is not a number",
                         "redis://[user:password@]host[:port][/db]")
    assert "s3cret" not in result.stdout + result.stderr
    result = train("--run-dir", str(tmp_path / "run"), env={"REDIS_URL": "http://u:s3cret@127.0.0.1:6379"})
    assert_clear_failure(result, "the environment's REDIS_URL: 'redis.url' = 'http://u:***@127.0.0.1:6379'")
    assert "s3cret" not in result.stdout + result.stderr


def test_a_config_that_cannot_learn_is_refused_naming_the_setting(tmp_path):
    result = train("run.n=1", "--run-dir", str(tmp_path / "run"))
    assert_clear_failure(result, "'run.n' = 1", "every advantage would be zero")
    assert not (tmp_path / "run").exists()


def test_bad_dataset_rows_are_skipped_and_counted(tiny_model, tmp_path):
    rows = [json.dumps({"problem": "1+1=", "answer": "2"}).encode(),
            json.dumps({"problem": "2+2=", "answer": None}).encode(),          # null answer
            json.dumps({"answer": "3"}).encode(),                               # no question
            json.dumps({"problem": "3+3=", "answer": ""}).encode(),             # empty answer
            b'{"problem": "4+4=\xff\xfe", "answer": "8"}',                       # invalid UTF-8
            json.dumps({"problem": "9" * 1_000_000 + "=", "answer": "1"}).encode(),  # a 1 MB prompt
            b"not json at all",
            json.dumps({"problem": "5+5=", "answer": "10"}).encode(),
            json.dumps({"problem": "6+6="}).encode(),                           # no answer field
            b"[1, 2]",                                                          # JSON, not an object
            json.dumps({"problem": "7+7=", "answer": "14"}).encode()]
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"\n".join(rows) + b"\n")
    result = train(f"data.source={data}", "data.template=plain", "data.id_field=null", "data.eval_source=null",
                   "run.m=4", "--run-dir", str(tmp_path / "run"))
    # The good rows are kept and each bad one counted in the summary; 3 usable prompts cannot fill run.m=4.
    assert_clear_failure(result, f"data.source '{data}': 3 usable prompts, fewer than run.m=4",
                         limit_s=LOADED_S)
    summary = [line for line in result.stdout.splitlines() if line.startswith(f"pcl: training set {data}: ")]
    assert len(summary) == 1, result.stdout
    assert ("kept 3 of 11 rows; skipped 1 without a question or id, 3 with a null or empty answer, "
            "1 too long, 3 unreadable") in summary[0]


def test_a_dataset_with_no_usable_row_or_no_file(tiny_model, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "1+1=", "solution": "2"}) + "\n")
    result = train(f"data.source={data}", "data.id_field=null", "data.eval_source=null", "--run-dir",
                   str(tmp_path / "run"))
    assert_clear_failure(result, f"data.source '{data}'", "no usable row",
                         "fields in the data: ['question', 'solution']", limit_s=LOADED_S)
    result = train(f"data.source={tmp_path / 'none.jsonl'}", "data.eval_source=null", "--run-dir",
                   str(tmp_path / "run2"))
    assert_clear_failure(result, f"data.source '{tmp_path / 'none.jsonl'}'", "does not exist",
                         limit_s=LOADED_S)


def test_resume_without_a_checkpoint_and_of_an_incomplete_one(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    result = train("--run-dir", str(run), "--resume")
    assert_clear_failure(result, f"--resume {run}: no complete checkpoint")
    (run / "checkpoints" / "step-000002").mkdir(parents=True)  # a write interrupted before its COMPLETE file
    result = train("--resume", str(run))
    assert_clear_failure(result, f"--resume {run}: no complete checkpoint",
                         "incomplete (no COMPLETE file", "checkpoints/step-000002")
    result = train("--resume", str(run / "checkpoints" / "step-000002"))
    assert_clear_failure(result, "step-000002: this checkpoint is incomplete")


def test_an_existing_run_is_not_overwritten(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    result = train("--run-dir", str(run))
    assert_clear_failure(result, f"run dir '{run}' already holds a run", "--resume")
    assert (run / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


def test_a_run_dir_that_is_a_file(tmp_path):
    path = tmp_path / "run"
    path.write_text("not a directory")
    assert_clear_failure(train("--run-dir", str(path)), f"run dir '{path}': cannot create it")


def test_resume_with_a_config_that_does_not_fit_the_checkpoint(tiny_model, tmp_path):
    import pcl.checkpoint_store as ckpt
    from pcl.config import dump_config, load_config

    run = tmp_path / "run"
    tmp = ckpt.begin(run / "checkpoints", 4)
    other = load_config(str(REPO / "configs/tiny.yaml"), ["run.seed=5", "run.m=32"])
    (tmp / "config.yaml").write_text(dump_config(other))
    (tmp / "state.json").write_text(json.dumps({"sampler": {"num_prompts": 999}}))
    ckpt.commit(tmp, run / "checkpoints", 4)
    result = train("--run-dir", str(run), "--resume")
    # one line per difference, under the message's first line
    assert_clear_failure(result, "cannot resume from", "run.seed is 0; the checkpoint's run had 5",
                         "run.m is 64; the checkpoint's run had 32",
                         "4096 usable prompts; the checkpoint's had 999", one_line=False, limit_s=LOADED_S)


def test_resume_refuses_a_structural_selection_change_naming_it(tiny_model, tmp_path):
    """pcl.loop.resume's rule at the command line: selection.type, or a setting GRESO adapts, given differently with
    --resume is refused before any actor starts (a tunable one is applied: tests/actors/test_checkpoint_resume.py)."""
    import pcl.checkpoint_store as ckpt
    from pcl.config import dump_config, load_config

    run = tmp_path / "run"
    tmp = ckpt.begin(run / "checkpoints", 4)
    saved = load_config(str(REPO / "configs/tiny.yaml"), ["selection.type=greso"])
    (tmp / "config.yaml").write_text(dump_config(saved))
    (tmp / "state.json").write_text(json.dumps({"step": 4, "sampler": {"num_prompts": 4096},
                                                "strategy": {"p_easy": 0.47, "p_hard": 0.5}}))
    ckpt.commit(tmp, run / "checkpoints", 4)
    result = train("--run-dir", str(run), "--resume", "selection.type=greso", "selection.p_easy=0.3")
    assert_clear_failure(result, "cannot resume from", "selection.p_easy is 0.3; the checkpoint's run started "
                         "from 0.5, which greso has adapted to 0.47 by step 4", one_line=False, limit_s=LOADED_S)
    result = train("--run-dir", str(run), "--resume", "selection.type=pcl")
    assert_clear_failure(result, "cannot resume from", "selection.type is 'pcl'; the checkpoint's run had 'greso'",
                         one_line=False, limit_s=LOADED_S)


def test_resume_on_data_edited_at_the_same_size_is_refused(tiny_model, tmp_path):
    """A checkpoint's data fingerprint against the training set now: an edited answer is named (the real run
    that writes the checkpoint is in tests/actors/test_checkpoint_resume.py)."""
    import pcl.checkpoint_store as ckpt
    from pcl.config import dump_config, load_config
    from pcl.data.prompts import load_prompts, load_rows
    from pcl.data.fingerprint import data_fingerprint

    rows, data = load_rows("tiny", size=80), tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = load_config(str(REPO / "configs/tiny.yaml"), [f"data.source={data}"])
    saved = data_fingerprint(load_prompts(cfg.data)[0])
    run = tmp_path / "run"
    tmp = ckpt.begin(run / "checkpoints", 4)
    (tmp / "config.yaml").write_text(dump_config(cfg))
    sampler = {"num_prompts": len(rows), "seed": 0, "epoch": 0, "cursor": 8, "data": saved}
    (tmp / "state.json").write_text(json.dumps({"sampler": sampler}))
    ckpt.commit(tmp, run / "checkpoints", 4)
    rows[5]["answer"] += "0"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = train(f"data.source={data}", "--run-dir", str(run), "--resume")
    assert_clear_failure(result, "cannot resume from", "the gold answers differ", one_line=False, limit_s=LOADED_S)
