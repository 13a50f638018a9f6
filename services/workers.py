"""The serving loops of the rollout and verifier workers, independent of Ray.

    service = RolloutService(engine, requests, results)      # WorkQueues of services.queues
    while running: service.serve_once()                      # take -> generate -> forward (put + ack)

    service = VerifierService(pool, answers, results, rewards)
    while running: service.serve_once()                      # take -> score -> forward

On-policy is enforced here: a request is served only by weights of exactly its `policy_version`. A request
for an older version is acknowledged and counted, never generated; one for a newer version is handed back
so a worker that already holds those weights takes it. Truncated responses are rewarded 0 (DESIGN 1.5).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Mapping

from pcl.engines.base import SamplingParams as EngineSampling
from services.payloads import RewardRecord, RolloutRequest, RolloutResult, pack_tokens, unpack_tokens
from services.queues import Delivery, WorkQueue

log = logging.getLogger(__name__)


class RolloutService:
    """Generates the n samples of each request with the engine's current weights."""

    def __init__(self, engine, requests: WorkQueue, results: WorkQueue, batch_requests: int = 64):
        self.engine, self.requests, self.results = engine, requests, results
        self.batch_requests = batch_requests
        self.lock = threading.Lock()  # generation and weight loads never overlap
        self.counts: Counter[str] = Counter()

    def load_weights(self, weights, version: int) -> int:
        with self.lock:
            return self.engine.load_weights(weights, version)

    def serve_once(self, block_ms: int | None = None) -> int:
        """Serve one batch of requests; returns the number of samples produced."""
        deliveries = self.requests.take(self.batch_requests, block_ms=block_ms)
        if not deliveries:
            return 0
        with self.lock:
            version = self.engine.policy_version
            stale = [d for d in deliveries if d.record.policy_version < version]
            ahead = [d for d in deliveries if d.record.policy_version > version or version < 0]
            ready = [d for d in deliveries if d.record.policy_version == version and version >= 0]
            if stale:
                self.requests.ack(stale)
                self.counts["stale_requests"] += len(stale)
            if ahead:
                self.requests.release(ahead)
                self.counts["requests_ahead_of_weights"] += len(ahead)
            produced = 0
            for group in _by_sampling(ready):
                produced += self._generate(group, version)
        return produced

    def _generate(self, deliveries: list[Delivery], version: int) -> int:
        reqs: list[RolloutRequest] = [d.record for d in deliveries]
        s = reqs[0].sampling
        n = reqs[0].n
        params = EngineSampling(n=n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                max_new_tokens=s.max_new_tokens, seed=s.seed)
        start = time.perf_counter()
        outputs = self.engine.generate([unpack_tokens(r.prompt_token_ids).tolist() for r in reqs], params)
        share = (time.perf_counter() - start) / max(1, n * len(reqs))
        records = [
            RolloutResult(run=r.run, step=r.step, prompt_id=r.prompt_id, sample_index=g.sample_index,
                          policy_version=version, prompt_token_ids=r.prompt_token_ids,
                          token_ids=pack_tokens(g.token_ids), text=g.text, finish_reason=g.finish_reason,
                          generation_seconds=share)
            for r, gens in zip(reqs, outputs) for g in gens
        ]
        self.requests.forward(deliveries, self.results, records)
        self.counts["samples"] += len(records)
        self.counts["tokens"] += sum(len(g.token_ids) for gens in outputs for g in gens)
        return len(records)


def _by_sampling(deliveries: list[Delivery]) -> list[list[Delivery]]:
    """Requests that share sampling parameters and n are generated in one engine call."""
    groups: dict[Any, list[Delivery]] = {}
    for d in deliveries:
        s = d.record.sampling
        groups.setdefault((d.record.n, s.temperature, s.top_p, s.top_k, s.max_new_tokens, s.seed), []).append(d)
    return list(groups.values())


class VerifierService:
    """Scores each result against its prompt's gold answer with the reward pool."""

    def __init__(self, pool, answers: Mapping[str, Any], results: WorkQueue, rewards: WorkQueue, batch: int = 512):
        self.pool, self.answers, self.results, self.rewards = pool, answers, results, rewards
        self.batch = batch
        self.counts: Counter[str] = Counter()

    def serve_once(self, block_ms: int | None = None) -> int:
        deliveries = self.results.take(self.batch, block_ms=block_ms)
        if not deliveries:
            return 0
        known = [d for d in deliveries if d.record.prompt_id in self.answers]
        for d in deliveries:
            if d.record.prompt_id not in self.answers:  # no gold answer: a poison record, never a hang
                self.results.fail(d, KeyError(f"no gold answer for prompt id {d.record.prompt_id!r}"))
        to_score = [d for d in known if d.record.finish_reason != "length"]
        outcomes = self.pool.score_batch([(d.record.text, self.answers[d.record.prompt_id]) for d in to_score])
        verdict = {d.id: o for d, o in zip(to_score, outcomes)}
        records = []
        for d in known:
            o = verdict.get(d.id)
            reward = 0.0 if o is None else float(o.reward)  # truncated: 0 without a verdict (DESIGN 1.5)
            records.append(RewardRecord.from_result(d.record, reward, 0.0 if o is None else o.seconds,
                                                    bool(o is not None and o.timed_out)))
            self.counts["timeouts"] += int(o is not None and o.timed_out)
            self.counts["truncated"] += int(o is None)
        self.results.forward(known, self.rewards, records)
        self.counts["verified"] += len(records)
        return len(records)


def serve_forever(service, stop: threading.Event, name: str, idle_block_ms: int = 200) -> None:
    """Run a service's loop until `stop` is set; an error is logged and the loop goes on."""
    while not stop.is_set():
        try:
            service.serve_once(block_ms=idle_block_ms)
        except Exception:  # noqa: BLE001 - a worker must outlive one bad batch; entries are redelivered
            log.exception("%s: serving a batch failed; its entries will be redelivered", name)
            time.sleep(0.5)
