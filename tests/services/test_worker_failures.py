"""Workers' serving loops when a batch fails: nothing stranded, exponential backoff, a quiet log.

The stranding test runs the real rollout serving loop (`serve_forever` over `RolloutService`, a real HF engine)
against a real Redis server; the engine fails its first generate() as an engine error would. The backoff and
logging tests drive `serve_forever` with a service that fails on every pass (pure code, no Redis).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from pcl.engines.hf import HFEngine
from services.streams.backoff import Backoff
from pcl.engines import RolloutRequest, SamplingParams
from services.streams.payloads import RequestRecord
from services.streams.queues import WorkQueue
from services.streams.topology import open_queue
from services.streams.workers import RolloutService, serve_forever

VISIBILITY_S = 5.0


class FailsOnce:
    """A real engine whose first generate() raises, as a CUDA error or an engine restart would."""

    def __init__(self, engine):
        self.engine, self.failures = engine, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, params):
        if not self.failures:
            self.failures += 1
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.engine.generate(prompts, params)


def request(run: str, pid: str, n: int = 2) -> RequestRecord:
    return RequestRecord.of(run, 0, 0, RolloutRequest(pid, (5, 6, 7), SamplingParams(n=n, max_new_tokens=4)))


def collect(reader: WorkQueue, count: int, deadline: float) -> list:
    got = []
    while len(got) < count and time.monotonic() < deadline:
        got += [r for d in reader.take(100) for r in d.records]
    return got


@pytest.mark.redis
def test_an_error_after_take_hands_the_entry_back_and_it_is_served_within_the_visibility_timeout(
        redis_client, key_prefix, tiny_model_dir):
    opts = dict(visibility_timeout_s=VISIBILITY_S, max_deliveries=3, block_ms=50)
    requests = open_queue(redis_client, key_prefix, "rollout_requests", "w0", max_in_flight=1, **opts)
    results = open_queue(redis_client, key_prefix, "rollout_results", "w0", **opts)
    engine = FailsOnce(HFEngine(str(tiny_model_dir), device="cpu", seed=0, num_threads=1))
    service = RolloutService(engine, requests, results, batch_requests=1)
    reader = open_queue(redis_client, key_prefix, "rollout_results", "reader", **opts)
    stop = threading.Event()
    thread = threading.Thread(target=serve_forever, args=(service, stop, "rollout-w0"), daemon=True)
    requests.put([request(key_prefix, "p0")])
    start = time.monotonic()
    thread.start()
    try:
        got = collect(reader, 2, start + VISIBILITY_S)
        assert engine.failures == 1
        assert sorted(r.sample_index for r in got) == [0, 1], "the failed request was not served again in time"
        assert time.monotonic() - start < VISIBILITY_S
        deadline = time.monotonic() + 5
        while (requests.in_flight or requests.depth()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert requests.in_flight == 0 and requests.depth() == 0  # nothing held, nothing pending
        assert requests.dead_letter_count() == 0
        # max_in_flight is 1: a held id left behind would block every later request of this worker.
        requests.put([request(key_prefix, "p1")])
        later = collect(reader, 2, time.monotonic() + VISIBILITY_S)
        assert sorted((r.prompt_id, r.sample_index) for r in later) == [("p1", 0), ("p1", 1)]
    finally:
        stop.set()
        thread.join(10)


class AlwaysFailing:
    """A service whose every pass fails (Redis refusing writes, an engine that stays broken), `fail_for` passes
    at a time: then one pass succeeds and the count starts again."""

    def __init__(self, fail_for: int = 10**9):
        self.calls: list[float] = []
        self.outcomes: list[bool] = []
        self.fail_for, self.released = fail_for, 0

    def serve_once(self, block_ms=None) -> int:
        self.calls.append(time.monotonic())
        ok = len(self.outcomes) % (self.fail_for + 1) == self.fail_for
        self.outcomes.append(ok)
        if not ok:
            raise ConnectionError("engine unreachable")
        return 1

    def release_held(self) -> None:
        self.released += 1


class RecordingStop(threading.Event):
    """The loop's stop event, recording each wait the loop asks of it (its backoff delays, as requested: a loaded
    machine may end a wait late, never early)."""

    def __init__(self):
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout=None):
        if timeout is not None:
            self.waits.append(timeout)
        return super().wait(timeout)


def run_loop(service, seconds: float, **options) -> RecordingStop:
    stop = RecordingStop()
    thread = threading.Thread(target=serve_forever, args=(service, stop, "worker-x"), kwargs=options, daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(5)
    assert not thread.is_alive(), "the loop did not stop within 5 s of its stop event"
    return stop


def test_a_failing_loop_backs_off_exponentially_and_logs_one_traceback(caplog):
    service = AlwaysFailing()
    with caplog.at_level(logging.INFO, logger="services.streams.workers"):
        stop = run_loop(service, 3.3)
    gaps = [b - a for a, b in zip(service.calls, service.calls[1:])]
    assert len(gaps) >= 4, gaps
    # the first retry is asked for after 0.1 s, each next one after twice the last ...
    assert stop.waits[:4] == pytest.approx([0.1, 0.2, 0.4, 0.8]), stop.waits
    for i, gap in enumerate(gaps):  # ... and each wait doubles (a wait never ends early; it may end late)
        assert gap >= 0.95 * 0.1 * 2**i, f"waits between passes do not double from 0.1 s: {gaps}"
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1, [r.getMessage() for r in caplog.records]
    assert len(caplog.records) <= 2, [r.getMessage() for r in caplog.records]
    assert service.released == len(service.calls)  # every failed pass handed its entries back


def test_backoff_is_capped_and_starts_again_after_a_success(caplog):
    service = AlwaysFailing(fail_for=6)
    with caplog.at_level(logging.INFO, logger="services.streams.workers"):
        run_loop(service, 2.5, backoff=Backoff(base_s=0.05, cap_s=0.4), log_every_s=0.5)
    gaps = [b - a for a, b in zip(service.calls, service.calls[1:])]
    assert len(gaps) >= 8, gaps
    # Six failures wait 0.05, 0.1, 0.2, 0.4, then the cap 0.4 twice (uncapped: 0.8, 1.6); then a success.
    for i, wait in enumerate([0.05, 0.1, 0.2, 0.4, 0.4, 0.4]):
        assert gaps[i] >= 0.95 * wait, gaps
    assert max(gaps[4:6]) < 0.75, gaps  # capped
    assert gaps[6] < 0.2, gaps  # after the success the next pass comes at once ...
    assert gaps[7] < 0.3, gaps  # ... and its failure waits base_s again, not the cap
    messages = [r.getMessage() for r in caplog.records]
    assert any("serving again after 6 failures" in m for m in messages), messages
    still = [m for m in messages if "still failing" in m]
    assert len(still) <= 2.5 / 0.5 + 1, messages  # at most one summary line per log_every_s


def test_backoff_delays_double_up_to_the_cap():
    backoff = Backoff(base_s=0.1, cap_s=1.0)
    assert [backoff.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.next() == 0.1
    for _ in range(2000):
        backoff.next()  # no overflow after many failures
    assert backoff.next() == 1.0
    with pytest.raises(ValueError, match="base_s"):
        Backoff(base_s=0, cap_s=1)
