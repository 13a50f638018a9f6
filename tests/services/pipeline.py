"""A single-process stand-in for the actors around the streams, for the fault and memory tests.

Generation and verification are replaced by deterministic functions so that only the queue layer is
under test: `generate(request)` makes the request's n results, `verify(result)` gives reward 1 to even
sample indices. `Streams` holds the three queues of one consumer; `run_step` drives one training step
through request -> result -> reward and commits it (collector complete, then trim).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from pcl.engines import RolloutRequest, SamplingParams
from services.streams.payloads import RequestRecord, RewardNote, RolloutResult, pack_tokens
from services.streams.collector import StepCollector
from services.streams.queues import WorkQueue
from services.streams.topology import STREAMS, open_queue


def make_requests(run: str, step: int, m: int, n: int, prompt_tokens: int = 12) -> list[RequestRecord]:
    sampling = SamplingParams(n=n, max_new_tokens=8)
    return [RequestRecord.of(run, step, step, RolloutRequest(f"prompt-{step}-{i}", tuple(range(i, i + prompt_tokens)),
                                                             sampling))
            for i in range(m)]


def generate(request: RequestRecord, new_tokens: int = 8) -> list[RolloutResult]:
    return [RolloutResult(request.run, request.step, request.prompt_id, j, request.policy_version,
                          request.prompt_token_ids, pack_tokens([j + 3] * new_tokens), f"{j}+{j}={2 * j}",
                          "stop", 0.001) for j in range(request.n)]


def verify(result: RolloutResult, entry_id: str, position: int) -> RewardNote:
    """The reward note of the result at `position` of results-stream entry `entry_id`."""
    return RewardNote.of(result, entry_id, position, float(result.sample_index % 2 == 0), 0.0001, False)


def verify_entry(delivery) -> list[RewardNote]:
    """The reward notes of every result of one results-stream delivery."""
    return [verify(r, delivery.id, i) for i, r in enumerate(delivery.records)]


@dataclass
class Streams:
    """The queues of a run (services.streams.topology.STREAMS) as seen by one consumer name."""

    requests: WorkQueue
    results: WorkQueue
    rewards: WorkQueue

    @classmethod
    def open(cls, client: redis.Redis, run: str, consumer: str, **options) -> "Streams":
        queues = {stream.name: open_queue(client, run, stream.name, consumer, **options) for stream in STREAMS}
        return cls(queues["rollout_requests"], queues["rollout_results"], queues["rewards"])

    def rollout_pass(self, batch: int = 64, block_ms: int = 0) -> int:
        """A rollout worker's turn: generate for taken requests; each request's n results go out as one
        group entry, with the request's ack."""
        deliveries = self.requests.take(batch, block_ms=block_ms)
        for delivery in deliveries:
            self.requests.forward([delivery], self.results, [generate(delivery.record)])
        return len(deliveries)

    def verify_pass(self, batch: int = 64, block_ms: int = 0) -> int:
        """A verifier's turn: reward taken result groups, forward one reward group each with the ack."""
        deliveries = self.results.take(batch, block_ms=block_ms)
        if deliveries:
            self.results.forward(deliveries, self.rewards, [verify_entry(d) for d in deliveries])
        return len(deliveries)

    def collect(self, collector: StepCollector, batch: int = 128) -> int:
        """The coordinator's turn: offer taken rewards to the step's collector, then ack them."""
        deliveries = self.rewards.take(batch, block_ms=5)
        collector.offer_all(record for d in deliveries for record in d.records)
        self.rewards.ack(deliveries)
        return len(deliveries)

    def commit(self) -> None:
        for queue in (self.requests, self.results, self.rewards):
            queue.trim_committed()


def run_step(streams: Streams, run: str, step: int, m: int, n: int, workers: bool = True,
             timeout_s: float = 60.0) -> StepCollector:
    """One step: put m requests, pump the pipeline (or only collect, when other threads or processes are
    the workers) until the batch is complete, commit. Raises TimeoutError if it never completes."""
    requests = make_requests(run, step, m, n)
    collector = StepCollector(run, step, step, {(r.prompt_id, j) for r in requests for j in range(n)},
                              resolve=streams.results.join)
    streams.requests.put(requests)
    deadline = time.monotonic() + timeout_s
    while not collector.complete:
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step}: {len(collector.missing)} samples missing after {timeout_s} s")
        if workers:
            streams.rollout_pass()
            streams.verify_pass()
        streams.collect(collector)
    streams.commit()
    return collector
