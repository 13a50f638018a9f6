"""`pcl chaos-check`: the invariants of a finished run from what it left, its Redis read where it is. A deployment's
Redis (`redis.url`) is read as it stands, with nothing started or stopped; a run that left neither a URL nor the
embedded server's data directory has its streams check skipped, which does not pass."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from entrypoints.chaos.check import check_run, run_checks
from entrypoints.chaos.final import read_run
from pcl.config import load_config

STEPS, M, N = 2, 2, 2


def write_records(run_dir: Path) -> None:
    """The records of a clean run of STEPS steps of M prompts x N samples, as the training loop writes them, and
    its TensorBoard events."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = [{"step": s, "policy_version": s, "effective_ratio": 0.5, "batch_samples": M * N,
                "batch_unique_samples": M * N, "dropped_stale_by_producer": {"rollout-1@old": s}}
               for s in range(1, STEPS + 1)]
    selections = [{"step": s, "ids": [f"p{s}-{i}" for i in range(M)], "samples": [list(range(N))] * M,
                   "versions": [[s - 1] * N] * M} for s in range(1, STEPS + 1)]
    for name, lines in (("metrics.jsonl", metrics), ("selections.jsonl", selections)):
        (run_dir / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
    writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
    for s in range(1, STEPS + 1):
        writer.add_scalar("pcl/effective_ratio", 0.5, global_step=s)
    writer.close()


def config(run: str, url: str | None = None, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.delenv("REDIS_URL", raising=False)
    overrides = [f"run.name={run}", f"run.steps={STEPS}", f"run.m={M}", f"run.n={N}"]
    return load_config(["configs/chaos.yaml"], overrides + ([f"redis.url={url}"] if url else []))


def test_a_run_that_left_no_redis_has_its_streams_check_skipped_which_does_not_pass(tmp_path, monkeypatch, capsys):
    write_records(tmp_path / "run")
    cfg = config("nothing", monkeypatch=monkeypatch)
    checks = {c.name: c for c in run_checks(cfg, read_run(cfg, tmp_path / "run"))}
    assert checks["streams"].ok is None and "no Redis data directory" in checks["streams"].detail
    assert checks["incarnations"].ok is None  # read from the same Redis
    assert all(checks[name].ok for name in ("steps", "batches", "versions", "trackers", "stale results")), checks
    assert checks["stale results"].detail == "2 results dropped as stale: by node ? 2; by producer rollout-1@old 2"
    assert check_run(cfg, tmp_path / "run") == 1
    assert "SKIP streams" in capsys.readouterr().out


@pytest.mark.redis
def test_a_deployments_run_is_checked_from_its_own_redis_which_is_read_where_it_is(tmp_path, capsys):
    """A run whose Redis is external: the streams are read from the server at redis.url (no RUN_DIR/redis, no
    server started for the reading), which keeps serving after it. A pending entry left there fails the check."""
    from pcl.tools.partition_checks import expected_instances
    from services.incarnations import Heartbeat, Identity
    from services.redis_server import start_embedded
    from services.streams.topology import STREAMS, open_queue
    from tests.services.test_queues import request

    run = f"deploy-{time.monotonic_ns()}"
    write_records(tmp_path / "run")
    with start_embedded(tmp_path / "deployment-redis", appendonly=False) as deployment:
        cfg = config(run, deployment.url)
        queues = {s.name: open_queue(deployment.client(), run, s.name, f"{s.consumer}-0", block_ms=20)
                  for s in STREAMS}
        for queue in queues.values():
            queue.put([request(f"p{i}") for i in range(3)])
            queue.ack(queue.take(10))
            queue.trim_committed()
        for instance in sorted(expected_instances(cfg)):  # every actor beat, once
            identity = Identity(instance.split("-")[0], instance, host="node-b", incarnation="old")
            assert Heartbeat(deployment.client(), run, identity).beat() is not None
        code, out = check_run(cfg, tmp_path / "run"), capsys.readouterr().out
        assert code == 0 and "PASS streams" in out and "result: PASS" in out, out
        assert "PASS stale results: 2 results dropped as stale: by node node-b 2" in out  # the registry's host
        assert not (tmp_path / "run" / "redis").exists() and deployment.client().ping()

        queues["rewards"].put([request("late")])
        queues["rewards"].take(1)  # held, never acknowledged: pending at the end
        checks = {c.name: c for c in run_checks(cfg, read_run(cfg, tmp_path / "run"))}
        assert checks["streams"].ok is False and "rewards: 1 pending entries" in checks["streams"].detail
        assert deployment.client().ping()


@pytest.mark.redis
def test_pcl_chaos_check_on_the_command_line_reads_redis_url_from_the_environment(tmp_path, monkeypatch, capsys):
    """`pcl chaos-check CONFIG --run-dir DIR`, with REDIS_URL in the environment as a deployment's containers
    have it: the run's Redis is read there; the exit status says whether every invariant held."""
    from entrypoints.cli import main
    from services.redis_server import start_embedded

    run = f"cli-{time.monotonic_ns()}"
    write_records(tmp_path / "run")
    with start_embedded(tmp_path / "deployment-redis", appendonly=False) as deployment:
        monkeypatch.setenv("REDIS_URL", deployment.url)
        code = main(["chaos-check", "configs/chaos.yaml", "--run-dir", str(tmp_path / "run"), f"run.name={run}",
                     f"run.steps={STEPS}", f"run.m={M}", f"run.n={N}"])
    out = capsys.readouterr().out
    assert code == 1 and "its Redis at" in out, out  # nothing of this run in that Redis: its streams are missing
    assert "FAIL streams: rollout_requests: the stream is missing" in out
