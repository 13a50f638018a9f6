"""Failures the queue layer must survive, against real Redis servers and real processes:
a consumer SIGKILLed mid-batch, Redis SIGKILLed and restarted mid-step, and memory over many steps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.streams.collector import StepCollector
from services.redis_server import make_client, start_embedded
from tests.services.pipeline import Streams, make_requests, run_step, verify_entry

pytestmark = pytest.mark.redis
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_entries_of_a_sigkilled_consumer_are_reclaimed_and_the_batch_is_exactly_once(redis_url, key_prefix):
    run, m, n = key_prefix, 16, 8
    client = make_client(redis_url)
    rescuer = Streams.open(client, run, "rescuer", visibility_timeout_s=0.5, block_ms=50)
    requests = make_requests(run, 1, m, n)
    rescuer.requests.put(requests)
    while rescuer.rollout_pass(batch=m):  # 16 result entries (a group of 8 samples each) are waiting
        pass
    victim = subprocess.Popen(
        [sys.executable, "-m", "tests.services.stream_worker", "--url", redis_url, "--run", run,
         "--consumer", "victim", "--take", "6", "--forward", "2", "--write-unacked", "1"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout.readline().strip() == "HOLDING 4"
        pending = client.xpending(rescuer.results.stream, rescuer.results.group)
        assert pending["consumers"] == [{"name": b"victim", "pending": 4}]
    finally:
        os.kill(victim.pid, signal.SIGKILL)  # mid-batch: 4 groups held, 1 of them already written downstream
        victim.wait(timeout=10)

    collector = StepCollector(run, 1, 1, {(r.prompt_id, j) for r in requests for j in range(n)},
                              resolve=rescuer.results.join)
    reclaimed, deadline = 0, time.monotonic() + 30
    while not collector.complete and time.monotonic() < deadline:
        deliveries = rescuer.results.take(64)
        reclaimed += sum(d.deliveries > 1 for d in deliveries)
        rescuer.results.forward(deliveries, rescuer.rewards, [verify_entry(d) for d in deliveries])
        rescuer.collect(collector)
    assert collector.complete and reclaimed == 4
    assert sorted(collector.records) == sorted((r.prompt_id, j) for r in requests for j in range(n))
    assert collector.dropped() == {"duplicates": n, "stale_step": 0, "stale_version": 0, "unexpected": 0,
                                  "unresolved": 0}
    assert rescuer.results.depth() == 0 and rescuer.rewards.depth() == 0


def test_redis_sigkilled_and_restarted_mid_step_loses_nothing_acknowledged(embedded_redis, caplog):
    """Producers and consumers keep going through a Redis crash; with the AOF synced on every write, every
    entry Redis had acknowledged before the crash is there after it, and every step completes exactly once."""
    run, m, n, steps, crash_step = "restart", 24, 8, 3, 1
    stop, mid_step, checked = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []
    lost: list[set] = []

    def worker(name: str) -> None:
        streams = Streams.open(embedded_redis.client(), run, name, visibility_timeout_s=2.0, block_ms=50)
        try:
            while not stop.is_set():
                streams.rollout_pass(batch=4, block_ms=20)
                streams.verify_pass(batch=64, block_ms=20)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    def crash_and_check() -> None:
        mid_step.wait(timeout=60)
        client = embedded_redis.client()
        keys = [f"pcl:{run}:{name}" for name in ("rollout_requests", "rollout_results", "rewards")]
        before = {key: {entry_id for entry_id, _ in client.xrange(key)} for key in keys}
        embedded_redis.restart(kill=True, downtime_s=1.0)
        after = {key: {entry_id for entry_id, _ in client.xrange(key)} for key in keys}
        lost.append(set().union(*(before[key] - after[key] for key in keys)))
        checked.set()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(2)]
    threads.append(threading.Thread(target=crash_and_check))
    for thread in threads:
        thread.start()
    coordinator = Streams.open(embedded_redis.client(), run, "coordinator", visibility_timeout_s=2.0, block_ms=50)
    pid_before = embedded_redis.pid
    try:
        for step in range(steps):
            requests = make_requests(run, step, m, n)
            collector = StepCollector(run, step, step, {(r.prompt_id, j) for r in requests for j in range(n)},
                                      resolve=coordinator.results.join)
            coordinator.requests.put(requests)
            deadline = time.monotonic() + 60
            while not collector.complete and time.monotonic() < deadline and not errors:
                coordinator.collect(collector, batch=64)
                if step == crash_step and len(collector.records) >= m * n // 3:
                    mid_step.set()
            assert collector.complete, f"step {step}: {len(collector.missing)} samples missing"
            assert sorted(collector.records) == sorted((r.prompt_id, j) for r in requests for j in range(n))
            if step == crash_step:
                assert checked.wait(timeout=60)  # compare before/after the crash before trimming
            coordinator.commit()
    finally:
        stop.set()
        mid_step.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors, errors
    assert lost == [set()]
    assert embedded_redis.pid != pid_before
    assert any("retrying" in record.getMessage() for record in caplog.records)  # the outage was felt


def _used_memory_after_steps(client, streams: Streams, run: str, steps: range, m: int, n: int) -> int:
    for step in steps:
        run_step(streams, run, step, m, n)
    time.sleep(0.5)  # let Redis' cron shrink client query buffers
    return client.info("memory")["used_memory"]


def _memory_stays_flat(tmp_path: Path, total_steps: int) -> None:
    with start_embedded(tmp_path, appendonly=False) as handle:  # private server: nothing else allocates
        client = handle.client()
        streams = Streams.open(client, "tiny", "w")
        baseline = _used_memory_after_steps(client, streams, "tiny", range(10), m=64, n=8)
        final = _used_memory_after_steps(client, streams, "tiny", range(10, total_steps), m=64, n=8)
        assert abs(final - baseline) <= 0.10 * baseline, (baseline, final)
        assert client.xlen("pcl:tiny:rewards") == 0
        # The control: the same traffic without trimming grows memory well past the tolerance.
        for step in range(total_steps, total_steps + 10):
            streams.commit = lambda: None
            run_step(streams, "tiny", step, m=64, n=8)
        untrimmed = client.info("memory")["used_memory"]
        print(f"Redis used_memory (m=64, n=8 per step): {baseline:,} B after 10 steps, {final:,} B after "
              f"{total_steps} ({final / baseline - 1:+.1%}); {untrimmed:,} B after 10 more without trimming")
        assert untrimmed > 1.3 * baseline


def test_memory_is_flat_over_100_steps(tmp_path):
    _memory_stays_flat(tmp_path, total_steps=100)


@pytest.mark.slow
def test_memory_is_flat_over_1000_steps(tmp_path):
    _memory_stays_flat(tmp_path, total_steps=1000)
