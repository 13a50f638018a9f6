"""Exact checkpoint and resume on real parts (local Ray, embedded Redis, a 2-rank gloo FSDP2 learner, the HF
engine, math-verify), on the warm-started tiny model, CPU, rollout.deterministic on:

2T steps straight through, against T steps, SIGKILL of the driver (`pcl train` process) mid-step T+1, and
`pcl train --resume` to 2T: the same prompts selected at every step and the final policy weights equal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.actors.faults import FAST, M, N, assert_each_step_once_and_exact_batches

pytestmark = [pytest.mark.ray, pytest.mark.redis]
REPO = Path(__file__).resolve().parents[2]
T = 3


def run_overrides(t: int = T) -> list[str]:
    """The run's config overrides: 2t deterministic steps, a checkpoint every t."""
    return [*FAST, f"run.steps={2 * t}", f"checkpoint.every={t}", "rollout.deterministic=true"]


def train_args(run_dir: Path, *extra: str, t: int = T) -> list[str]:
    return [sys.executable, "-m", "entrypoints.cli", "train", "configs/tiny.yaml", *run_overrides(t),
            "--run-dir", str(run_dir), *extra]


def pcl_train(run_dir: Path, *extra: str, t: int = T, **kwargs):
    return subprocess.Popen(train_args(run_dir, *extra, t=t), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def pcl_train_to_end(run_dir: Path, *extra: str, t: int = T) -> str:
    run = pcl_train(run_dir, *extra, t=t)
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 0, out[-3000:]
    return out


def final_weights(run_dir: Path, t: int = T) -> dict:
    ckpt = run_dir / "checkpoints" / f"step-{2 * t:06d}"
    return torch.load(ckpt / "learner.pt", map_location="cpu", weights_only=True)["model"]


# SPEED with carry_over holds prompts and their screening samples across steps: its checkpoint must carry them.
SPEED_CARRY = ("selection.type=speed", "selection.k=2", "selection.n_init=2", "selection.carry_over=true")


# The default suite runs the short form (T=2, PCL): the straight run and the resume in this process on the suite's Ray
# (`run_training`, as `pcl train` calls it), the killed run a `pcl train` process with its own Ray and Redis.
# make test-slow runs T=3 with PCL and with SPEED carrying screened prompts across the kill, every run a `pcl train`
# process. `pcl chaos` kills the driver under load as well.
def test_a_sigkilled_driver_resumes_every_step_once_to_the_same_prompts_and_weights(tiny_model, ray_session, tmp_path,
                                                                                     capsys):
    from entrypoints.train import run_training
    from pcl.config import load_config

    def train_here(run_dir: Path, resume: str | None = None) -> str:
        cfg = load_config("configs/tiny.yaml", run_overrides(t=2))
        assert run_training(cfg, run_dir=str(run_dir), resume=resume) == 0
        return capsys.readouterr().out

    sigkill_and_resume(tmp_path, (), t=2, straight=train_here, resume=lambda run_dir: train_here(run_dir, resume=""))


@pytest.mark.slow
@pytest.mark.parametrize("selection", [(), SPEED_CARRY], ids=["pcl", "speed"])
def test_sigkilled_driver_resumes_to_the_same_prompts_and_weights(tiny_model, tmp_path, selection):
    sigkill_and_resume(tmp_path, selection, t=T)


def sigkill_and_resume(tmp_path: Path, selection: tuple[str, ...], t: int, straight=None, resume=None) -> None:
    """2t steps straight; the same run SIGKILLed (driver, its Ray, its Redis) once its step-t checkpoint is complete,
    then `--resume` to 2t: every step once, exact batches, the same prompts at every step, equal final weights.
    `straight(run_dir)` and `resume(run_dir)` run those two (each returns what it printed); by default each is a
    `pcl train` process."""
    straight_dir, resumed = tmp_path / "straight", tmp_path / "resumed"
    (straight or (lambda run_dir: pcl_train_to_end(run_dir, *selection, t=t)))(straight_dir)

    # The same run, killed like a crashed machine while step t+1 is under way (its checkpoint at t is complete).
    # The kill follows the step-t checkpoint's COMPLETE marker within milliseconds, not the printed step line,
    # which trails its step by up to a second: on a fast machine steps t+1..2t can be done by then.
    victim = pcl_train(resumed, *selection, t=t, start_new_session=True)
    printed: list[str] = []
    drain = threading.Thread(target=lambda: printed.extend(victim.stdout), daemon=True)
    drain.start()
    marker, deadline = resumed / "checkpoints" / f"step-{t:06d}" / "COMPLETE", time.monotonic() + 600
    while not marker.is_file():
        if victim.poll() is not None or time.monotonic() > deadline:
            drain.join(timeout=10)
            pytest.fail(f"the run wrote no step-{t} checkpoint (exit {victim.poll()}): {''.join(printed)[-3000:]}")
        time.sleep(0.005)
    os.killpg(victim.pid, signal.SIGKILL)  # the driver and everything it started (its local Ray, its Redis)
    victim.wait(timeout=30)
    assert (resumed / "checkpoints" / f"step-{t:06d}" / "COMPLETE").is_file()
    assert not (resumed / "checkpoints" / f"step-{2 * t:06d}").exists()

    out = (resume or (lambda run_dir: pcl_train_to_end(run_dir, *selection, "--resume", t=t)))(resumed)
    assert f"restored step {t} (policy version {t})" in out

    expected = [json.loads(line) for line in (straight_dir / "selections.jsonl").read_text().splitlines()]
    got = [json.loads(line) for line in (resumed / "selections.jsonl").read_text().splitlines()]
    assert [s["step"] for s in got] == list(range(1, 2 * t + 1))
    assert got == expected  # the same prompt ids, in the same order, at every step
    a, b = final_weights(straight_dir, t), final_weights(resumed, t)
    assert a.keys() == b.keys()
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert worst <= 1e-6, worst
    first = final_weights(straight_dir, t)  # and training did move the weights: the comparison is not vacuous
    initial = torch.load(straight_dir / "checkpoints" / f"step-{t:06d}" / "learner.pt", weights_only=True)["model"]
    assert max((first[k] - initial[k]).abs().max().item() for k in first) > 1e-6
    # The checkpoint's policy/ is a Hugging Face model holding exactly the learner's weights.
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(resumed / "checkpoints" / f"step-{2 * t:06d}" / "policy")
    hf_state = hf.state_dict()
    assert max((hf_state[k] - b[k]).abs().max().item() for k in b) == 0.0
    records = assert_each_step_once_and_exact_batches(resumed, 2 * t)
    straight_records = assert_each_step_once_and_exact_batches(straight_dir, 2 * t)
    assert [r["train_reward_mean"] for r in records] == [r["train_reward_mean"] for r in straight_records]
    assert M * N == records[0]["batch_samples"]
    if selection:  # the resumed step continued prompts screened before the kill
        assert records[t]["speed_carried_in"] == straight_records[t]["speed_carried_in"] > 0
    assert_every_actor_beat_once_per_driver(resumed, selection)


def assert_every_actor_beat_once_per_driver(run_dir: Path, selection: tuple[str, ...]) -> None:
    """Every long-lived actor beat its heartbeat (services/incarnations.py), once for the killed driver's fleet and
    once for the resumed one's (the registry outlives the kill in the embedded Redis' AOF), never two of one
    instance at once: the killed fleet's actors were gone before the resumed one's started."""
    from entrypoints.chaos.final import run_redis
    from pcl.config import load_config
    from pcl.tools.partition_checks import check_incarnations, expected_instances
    from services.incarnations import read_incarnations

    cfg = load_config("configs/tiny.yaml", [*FAST, *selection])
    with run_redis(cfg, run_dir) as client:
        incarnations = read_incarnations(client, cfg.run.name)
    expected = expected_instances(cfg)
    check = check_incarnations(incarnations, expected)
    assert check.ok, check.detail
    starts = {name: sum(e["instance"] == name for e in incarnations) for name in expected}
    assert all(count >= 2 for count in starts.values()), starts


@pytest.mark.slow  # tests/entrypoints/test_bad_input.py checks the same refusal in the default suite, without a run
def test_resume_on_a_dataset_edited_or_reordered_at_the_same_size_is_refused(tiny_model, tmp_path):
    """The checkpoint holds the fingerprint of the training set (ids, questions, answers, in order): one answer
    edited, or two rows swapped, at the same size, is refused by name before any actor starts; the same file
    resumes."""
    from pcl.data.prompts import load_rows
    rows = load_rows("tiny", size=64)
    data, run_dir = tmp_path / "train.jsonl", tmp_path / "run"

    def write(rows: list[dict]) -> None:
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))

    def train(*extra: str) -> subprocess.CompletedProcess:
        args = [sys.executable, "-m", "entrypoints.cli", "train", "configs/tiny.yaml", *FAST, f"data.source={data}",
                "run.steps=1", "checkpoint.every=1", "--run-dir", str(run_dir), *extra]
        return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)

    write(rows)
    first = train()
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    edited = [dict(row) for row in rows]
    edited[17]["answer"] = str(int(edited[17]["answer"]) + 1)
    swapped = [rows[1], rows[0], *rows[2:]]
    for changed, needle in [(edited, "the gold answers differ"),
                            (swapped, "the same 64 prompts and answers in another order")]:
        write(changed)
        refused = train("--resume")
        assert refused.returncode == 2, (refused.stdout + refused.stderr)[-3000:]
        assert "cannot resume from" in refused.stderr and needle in refused.stderr, refused.stderr[-3000:]
        assert "actors up" not in refused.stdout  # refused before any actor started
    write(rows)
    same = train("--resume")
    assert same.returncode == 0, (same.stdout + same.stderr)[-3000:]
    assert "restored step 1" in same.stdout


@pytest.mark.slow  # the default suite's resume: the SIGKILLed driver above; the refusals: tests/entrypoints/test_bad_input.py
def test_a_tau_given_with_resume_is_trained_with_and_said(tmp_path):
    """`--resume selection.tau=0.4` on a run that checkpointed with tau 0.5: the override is printed, the resumed
    steps train with 0.4 (their records' tau), and a changed selection.type is refused naming it."""
    from pcl.tiny.build import build_tiny

    build_tiny(seed=0)
    run_dir = tmp_path / "run"

    def train(steps: int, *extra: str) -> subprocess.CompletedProcess:
        args = [sys.executable, "-m", "entrypoints.cli", "train", "configs/tiny.yaml", *FAST, f"run.steps={steps}",
                "checkpoint.every=1", "--run-dir", str(run_dir), *extra]
        return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)

    first = train(1)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    refused = train(2, "--resume", "selection.type=dynamic_sampling")  # a type that takes FAST's selection.k
    assert refused.returncode != 0
    assert "selection.type is 'dynamic_sampling'; the checkpoint's run had 'pcl'" in refused.stdout + refused.stderr
    resumed = train(2, "--resume", "selection.tau=0.4")
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "pcl: selection.tau: 0.4 given with --resume overrides 0.5 from checkpoint step 1" in out
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["tau"]) for r in records if "tau" in r] == [(1, 0.5), (2, 0.4)]
