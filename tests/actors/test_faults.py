"""Failures survived by a running tiny training, on real parts (local Ray, Redis, the 2-rank gloo FSDP2 learner,
the HF engine, math-verify): an actor process SIGKILLed mid-step, Redis killed and restarted. After each, the run
reaches its target step, every step is logged once, and every committed batch holds each (prompt, sample)
exactly once. What each failure does (docs/operations.md):

- rollout worker, verifier, value scorer: Ray restarts the actor; the stream entries it held are reclaimed after
  the visibility timeout; a restarted rollout worker gets the current weights from the coordinator; a restarted
  scorer takes V from the newest checkpoint. The run goes on without a restart. (With deterministic rollouts the
  scorer is not restarted in place: tests/actors/test_scorer.py.)
- learner rank, coordinator: the driver restarts the run from the newest complete checkpoint (one restart),
  starting again only the lost actors and the coordinator; the others are kept and restored.
- Redis: clients reconnect with backoff; with AOF on, nothing acknowledged is lost.
"""

from __future__ import annotations

import json

import pytest

from pcl.config import load_config
from entrypoints.chaos.reference import weights_diff
from tests.actors.faults import (FAST, TrainingThread, actor_pids, assert_each_step_once_and_exact_batches,
                                 checkpoint_written, embedded_redis_pid, sigkill, steps_logged, wait_until)

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.slow, pytest.mark.usefixtures("tiny_model")]
STEPS = 6


def start(tmp_path, *extra: str) -> TrainingThread:
    cfg = load_config("configs/tiny.yaml", [*FAST, f"run.steps={STEPS}", "checkpoint.every=2",
                                            "rollout.max_in_flight=1", *extra])
    thread = TrainingThread(cfg, tmp_path / "run")
    thread.start()
    return thread


def finish(thread: TrainingThread, timeout_s: float = 600) -> dict:
    thread.join(timeout_s)
    assert not thread.is_alive(), "the run did not finish"
    assert thread.result == 0, thread.result
    assert_each_step_once_and_exact_batches(thread.run_dir, STEPS)
    return json.loads((thread.run_dir / "summary.json").read_text())


def mid_step_3(thread: TrainingThread) -> None:
    """Returns within milliseconds of the checkpoint at step 2 becoming complete, so that step 3 is under way
    (its selection or generation: rollout.max_in_flight=1 has the worker generate one prompt at a time, a few
    tenths of a second in all on a fast machine) when the caller strikes."""
    wait_until(lambda: checkpoint_written(thread.run_dir, 2), 300, "the checkpoint at step 2", thread,
               interval_s=0.005)
    assert steps_logged(thread.run_dir) == [1, 2]


@pytest.mark.parametrize("actor", ["RolloutWorker", "RewardVerifier", "ValueScorerActor"])
def test_a_killed_worker_actor_is_restarted_in_place(actor, ray_session, tmp_path):
    thread = start(tmp_path)
    mid_step_3(thread)
    sigkill(actor)
    summary = finish(thread)
    assert summary["restarts"] == 0  # no fleet restart: Ray restarted the actor and the step went on
    records = [json.loads(line) for line in (thread.run_dir / "metrics.jsonl").read_text().splitlines()]
    if actor == "RolloutWorker":
        assert records[-1]["worker_reloads"] >= 1  # the restarted worker got the current weights


def test_a_killed_learner_rank_restarts_the_run_from_its_checkpoint(ray_session, tmp_path):
    thread = start(tmp_path)
    mid_step_3(thread)
    sigkill("LearnerRank", index=-1)
    summary = finish(thread)
    assert summary["restarts"] == 1
    assert summary["steps"] == STEPS
    # the learner ranks share a process group: both start again; the workers, V and the sampler were kept
    assert summary["started_again"] == [["coordinator", "learner-0", "learner-1"]]


def test_a_killed_coordinator_restarts_alone_and_the_run_replays_exactly(ray_session, tmp_path):
    """A restart keeps every actor that survived and restores it from the checkpoint like a new one: the run's
    final weights equal an unfaulted run's (deterministic rollouts)."""
    thread = start(tmp_path / "faulted", "rollout.deterministic=true")
    mid_step_3(thread)
    workers = actor_pids("RolloutWorker")
    sigkill("Coordinator")
    wait_until(lambda: len(steps_logged(thread.run_dir)) >= 4, 300, "a step after the restart", thread)
    assert actor_pids("RolloutWorker") == workers  # the same processes serve on
    summary = finish(thread)
    assert summary["restarts"] == 1
    assert summary["started_again"] == [["coordinator"]]
    reference = start(tmp_path / "reference", "rollout.deterministic=true")
    finish(reference)
    assert weights_diff(thread.run_dir, reference.run_dir, STEPS) == 0.0


def test_redis_killed_and_restarted_mid_run(ray_session, tmp_path):
    from services.redis_server import start_embedded

    with start_embedded(tmp_path / "redis", appendonly=True) as redis:
        thread = start(tmp_path, f"redis.url={redis.url}")
        mid_step_3(thread)
        redis.restart(kill=True, downtime_s=2.0)
        summary = finish(thread)
    assert summary["steps"] == STEPS


def test_the_embedded_redis_exiting_mid_run_is_restarted_by_the_driver(ray_session, tmp_path):
    """The driver's own Redis (no redis.url) killed mid-step, as a full disk (Redis exits on its AOF write error)
    or the OOM killer would: the driver starts it again on its data directory and the run goes on."""
    import os
    import signal

    thread = start(tmp_path)
    mid_step_3(thread)
    os.kill(embedded_redis_pid(thread.run_dir / "redis"), signal.SIGKILL)
    summary = finish(thread)
    assert summary["redis_restarts"] == 1 and summary["steps"] == STEPS


def test_a_checkpoint_that_does_not_fit_fails_clearly_leaves_nothing_partial_and_resumes(ray_session, tmp_path):
    """checkpoints/ on a real 40 MiB filesystem: the tiny run's checkpoint (about 27 MB) at step 2 fits, the one at
    step 4 does not. The run stops with an error naming the directory and the bytes needed, no `.tmp-*` is left,
    step 2 stays intact, and once space is freed the run resumes from it to the end."""
    from tests.small_disk import remount, tmpfs

    root = tmp_path / "run" / "checkpoints"
    with tmpfs(root, size="40m"):
        thread = start(tmp_path)
        thread.join(600)
        assert not thread.is_alive(), "the run did not finish"
        message = str(thread.result)
        assert f"checkpoint at step 4: not enough free space in {root}" in message, message[-2000:]
        assert "bytes) needed (the size of step-000002, plus 5%)" in message, message[-2000:]
        assert sorted(p.name for p in root.iterdir()) == ["step-000002"]  # no partial checkpoint left
        remount(root, "200m")  # space freed
        cfg = load_config("configs/tiny.yaml", [*FAST, f"run.steps={STEPS}", "checkpoint.every=2",
                                                "rollout.max_in_flight=1"])
        resumed = TrainingThread(cfg, tmp_path / "run", resume="")
        resumed.start()
        summary = finish(resumed)
    assert summary["steps"] == STEPS


ASYNC = ["run.max_staleness=1", "learner.off_policy.correction=truncated"]


@pytest.mark.parametrize("fault", ["RolloutWorker", "RewardVerifier", "LearnerRank", "redis"])
def test_asynchronous_steps_survive_the_same_faults(fault, ray_session, tmp_path):
    """With run.max_staleness=1 (two rollout workers, so that a lost one's share goes to the other while the
    learner trains ahead): the run reaches its step count, every batch holds each (prompt, sample) once, and every
    sample was generated by the version one before its step's (the first step's by its own)."""
    import os
    import signal

    thread = start(tmp_path, *ASYNC, "rollout.num_workers=2")
    mid_step_3(thread)
    if fault == "redis":
        os.kill(embedded_redis_pid(thread.run_dir / "redis"), signal.SIGKILL)
    else:
        sigkill(fault, index=-1 if fault == "LearnerRank" else 0)
    summary = finish(thread)
    assert summary["steps"] == STEPS and summary["restarts"] == (1 if fault == "LearnerRank" else 0)
    selections = [json.loads(line) for line in (thread.run_dir / "selections.jsonl").read_text().splitlines()]
    for line in selections:
        versions = {v for group in line["versions"] for v in group}
        assert versions == {max(0, line["step"] - 2)}, line  # step 1 by version 0; step s by version s - 2
