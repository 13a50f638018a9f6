"""A full Redis (maxmemory reached, noeviction: writes get OOM errors) is backpressure, not a failure.

Each test runs a private embedded Redis server and fills it for real: a filler key, then `maxmemory` just below
the memory in use, so every write (XADD, XGROUP CREATE, MULTI with either) is refused until the filler is
deleted, while reads, acks and claims still go through. The rollout worker is the real serving loop with a real
HF engine.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
import redis
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pcl.engines.hf import HFEngine
from pcl.engines import RolloutRequest, SamplingParams
from services.streams.payloads import RequestRecord
from services.control.store import ControlStore
from services.control.metrics import metrics_registry
from services.streams.queues import QueueUnavailable, RedisFull
from services.streams.topology import open_queue
from services.redis_server import default_maxmemory, make_client, start_embedded
from services.streams.workers import RolloutService, serve_forever

pytestmark = pytest.mark.redis
FILLER = "filler"


@pytest.fixture
def handle(tmp_path):
    with start_embedded(tmp_path / "redis", appendonly=False) as server:
        yield server


@pytest.fixture
def client(handle):
    return handle.client()


def fill(client: redis.Redis) -> None:
    """Make Redis full: writes are refused until free() deletes the filler keys (4 MB in small values, so that
    no large client buffer is counted in the memory in use and then freed)."""
    pipe = client.pipeline(transaction=False)
    for i in range(400):
        pipe.set(f"{FILLER}:{i}", b"f" * 10_000)
    pipe.execute()
    time.sleep(0.2)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 500_000)
    with pytest.raises(redis.OutOfMemoryError):
        client.set("probe", b"x")


def free(client: redis.Redis) -> None:
    client.delete(*[f"{FILLER}:{i}" for i in range(400)])


def request(run: str, pid: str, n: int = 2) -> RequestRecord:
    return RequestRecord.of(run, 0, 0, RolloutRequest(pid, (5, 6, 7), SamplingParams(n=n, max_new_tokens=4)))


def test_a_full_redis_pauses_generation_and_it_resumes_when_memory_frees(client, tiny_model_dir, caplog):
    run = "full"
    opts = dict(visibility_timeout_s=1.0, max_deliveries=3, block_ms=50)
    requests = open_queue(client, run, "rollout_requests", "w0", **opts)
    results = open_queue(client, run, "rollout_results", "w0", **opts)
    reader = open_queue(client, run, "rollout_results", "reader", **opts)
    requests.put([request(run, "p0"), request(run, "p1")])
    fill(client)
    service = RolloutService(HFEngine(str(tiny_model_dir), device="cpu", seed=0, num_threads=1), requests, results,
                             batch_requests=1)
    stop = threading.Event()
    thread = threading.Thread(target=serve_forever, args=(service, stop, "rollout-w0"), daemon=True)
    with caplog.at_level(logging.INFO):
        thread.start()
        try:
            deadline = time.monotonic() + 120  # the worker has generated a request and waits to write its results
            while not any("Redis is full" in r.getMessage() for r in caplog.records):
                assert thread.is_alive() and time.monotonic() < deadline, "the worker never met the full Redis"
                time.sleep(0.05)
            time.sleep(4.0)  # four visibility timeouts while it waits: what it holds must stay its own
            assert thread.is_alive()
            assert client.xlen(results.stream) == 0
            pending = client.xpending_range(requests.stream, "rollout", "-", "+", 10)
            # The worker keeps the request it generated (delivered once, never reclaimed nor dead-lettered) and
            # takes no other: generation is paused while its results cannot be written.
            assert [(p["consumer"], p["times_delivered"]) for p in pending] == [(b"w0", 1)]
            assert requests.dead_letter_count() == 0
            full_lines = [r for r in caplog.records if "Redis is full" in r.getMessage()]
            assert len(full_lines) == 1 and full_lines[0].levelno == logging.WARNING
            assert not [r for r in caplog.records if r.exc_info], "a full Redis is not an error with a traceback"

            free(client)  # memory frees
            got, deadline = [], time.monotonic() + 120
            while len(got) < 4 and time.monotonic() < deadline:
                got += [r for d in reader.take(100) for r in d.records]
            assert sorted((r.prompt_id, r.sample_index) for r in got) == [("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1)]
            deadline = time.monotonic() + 60  # the worker forgets what it held just after its write returns
            while (requests.depth() or requests.in_flight) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert requests.depth() == 0 and requests.in_flight == 0
            assert requests.full_waits == 1 and requests.full_seconds >= 3.5  # the wait is reported
            assert any("Redis has memory again" in r.getMessage() for r in caplog.records)
        finally:
            stop.set()
            thread.join(10)


def test_a_write_waits_for_memory_then_gives_up_after_full_timeout_s(client):
    queue = open_queue(client, "full", "rollout_requests", "coordinator", full_timeout_s=1.0)
    fill(client)
    start = time.monotonic()
    with pytest.raises(RedisFull, match="maxmemory"):
        queue.put([request("full", "p0")])
    assert 1.0 <= time.monotonic() - start < 5.0
    assert issubclass(RedisFull, QueueUnavailable)  # the driver restarts from its checkpoint, purging the streams

    threading.Timer(1.0, free, args=(client,)).start()
    start = time.monotonic()
    queue.full_timeout_s = 30.0
    assert len(queue.put([request("full", "p0")])) == 1  # waits, then goes through once memory frees
    assert 0.9 <= time.monotonic() - start < 10.0


def test_dead_letter_streams_are_capped_by_bytes(client):
    queue = open_queue(client, "full", "rollout_results", "v", block_ms=20, dead_letter_max_bytes=2_000_000)
    for _ in range(30):  # undecodable entries of 250 KB each go to the dead letters at once
        client.xadd(queue.stream, {b"d": os.urandom(250_000)})
    while queue.take(100):
        pass
    assert queue.dead_letter_count() == 30
    used = client.memory_usage(queue.dead_stream, samples=0)
    assert 1_000_000 <= used <= 2_000_000 + 300_000, used  # about the cap: 7.5 MB were dead-lettered
    newest = client.xrevrange(queue.dead_stream, count=1)[0][1]
    last = client.xrevrange(queue.stream, count=1)[0][0]
    assert newest[b"entry_id"] == last  # the oldest went first


def test_a_full_redis_shows_in_the_metrics(handle, client):
    store = ControlStore(make_client(handle.url, decode_responses=True), "full")

    def memory() -> tuple[float, float]:
        text = generate_latest(metrics_registry(store)).decode()
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        return values["pcl_redis_memory_used_bytes"], values["pcl_redis_memory_max_bytes"]

    used, limit = memory()
    assert 0 < used < limit  # the embedded server's default maxmemory
    fill(client)
    used, limit = memory()
    assert 0 < limit <= used
    free(client)
    used, limit = memory()
    assert used < limit
    store.client.close()


def test_the_embedded_server_has_a_maxmemory_and_keeps_it_across_restarts(tmp_path, handle):
    assert int(handle.client().config_get("maxmemory")["maxmemory"]) == default_maxmemory() > 0
    with start_embedded(tmp_path / "small", appendonly=False, maxmemory_mb=64) as small:
        assert small.client().config_get("maxmemory") == {"maxmemory": str(64 * 2**20)}
        assert small.client().config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        small.restart()
        assert small.client().config_get("maxmemory") == {"maxmemory": str(64 * 2**20)}


def test_the_drivers_own_writes_wait_while_redis_is_full(handle, client, tmp_path):
    """`pcl chaos`, seed 7: Redis held full while the fleet started again after a restart; publishing the gold
    answers got OutOfMemoryError and ended the driver. The driver's writes (the answers, its control state) wait for
    memory as the workers' do."""
    from pcl.config import load_config
    from services.control.server import DriverControl
    from services.redis_keeper import wait_while_full
    from services.streams.rollout_client import answers_key, publish_answers

    cfg = load_config("configs/tiny.yaml", ["control.enabled=false", "run.name=full-driver"])
    fill(client)
    with pytest.raises(redis.OutOfMemoryError):  # what the driver met
        publish_answers(handle.url, "full-driver", {"p1": "42"})
    threading.Timer(1.0, free, args=(client,)).start()
    started = time.monotonic()
    wait_while_full(lambda: publish_answers(handle.url, "full-driver", {"p1": "42"}), "the gold answers", 60)
    assert client.hget(answers_key("full-driver"), "p1") == b'"42"' and time.monotonic() - started >= 0.5
    client.config_set("maxmemory", 0)
    fill(client)
    threading.Timer(1.0, free, args=(client,)).start()
    control = DriverControl(cfg, handle.url, tmp_path, k_max=7, fresh=False)  # a resumed driver's start
    try:
        assert control.store.desired().k_max == 7
    finally:
        control.close()
