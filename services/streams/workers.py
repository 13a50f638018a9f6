"""The serving loops of the rollout and verifier workers, independent of Ray.

    service = RolloutService(engine, requests, results)      # WorkQueues of services.streams.queues
    while running: service.serve_once()                      # take -> generate -> forward (put + ack)

    service = VerifierService(pool, answers, results, rewards)
    while running: service.serve_once()                      # take -> score -> forward

On-policy is enforced here: a request is served only by weights of exactly its `policy_version`. A request
for an older version is acknowledged and counted, never generated; one for a newer version is handed back
so a worker that already holds those weights takes it. Truncated responses are rewarded 0 (algorithm step 5).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, Mapping

from pcl.engines.batching import by_sampling
from pcl.reward.verdict import TRUNCATED_REWARD, is_truncated
from services.incarnations import INCARNATION
from services.streams.backoff import Backoff, FailureLog
from services.streams.payloads import (RequestRecord, RewardNote, RolloutResult, pack_logprobs, pack_tokens,
                                      unpack_tokens)
from services.streams.queues import WorkQueue

log = logging.getLogger(__name__)
RETRY_BASE_S, RETRY_CAP_S = 0.1, 30.0  # a failing serving loop waits 0.1, 0.2, 0.4, ... 30 s between passes
LOG_EVERY_S = 60.0  # while it keeps failing, one summary line per minute after the first traceback


class RolloutService:
    """Generates the n samples of each request with the engine's current weights.

    A request entry holds one request or a chunk of them (`RolloutClient` writes a step's requests as one chunk
    per live worker); a worker takes `entries_per_read` entries per pass (one by default), so no worker takes
    more than its chunk while another waits (docs/queues.md, "A balanced fleet"). Results name the worker
    (`worker`) and carry the engine's log-probabilities of the sampled tokens (`logprobs`) when it reports them.
    """

    def __init__(self, engine, requests: WorkQueue, results: WorkQueue, batch_requests: int = 64,
                 worker: str = "", entries_per_read: int = 1):
        self.engine, self.requests, self.results = engine, requests, results
        self.batch_requests = batch_requests  # requests per engine call, at most
        self.worker, self.entries_per_read = worker, entries_per_read
        self.lock = threading.Lock()  # generation and weight loads never overlap
        self.counts: Counter[str] = Counter()

    def release_held(self) -> int:
        """Hand back the requests of a failed pass (see WorkQueue.release_held)."""
        return self.requests.release_held()

    def load_weights(self, weights, version: int) -> int:
        with self.lock:
            return self.engine.load_weights(weights, version)

    def serve_once(self, block_ms: int | None = None) -> int:
        """Serve one read of request entries; returns the number of samples produced."""
        deliveries = self.requests.take(self.entries_per_read, block_ms=block_ms)
        if not deliveries:
            return 0
        with self.lock:
            version = self.engine.policy_version
            entry_version = {d.id: d.records[0].policy_version for d in deliveries}  # a chunk has one version
            stale = [d for d in deliveries if entry_version[d.id] < version]
            ahead = [d for d in deliveries if entry_version[d.id] > version or version < 0]
            ready = [d for d in deliveries if entry_version[d.id] == version and version >= 0]
            if stale:
                self.requests.ack(stale)
                self.counts["stale_requests"] += sum(len(d.records) for d in stale)
            if ahead:
                self.requests.release(ahead)
                self.counts["requests_ahead_of_weights"] += sum(len(d.records) for d in ahead)
            if not ready:
                return 0
            groups: list[list[RolloutResult]] = []
            for batch in by_sampling([r for d in ready for r in d.records], self.batch_requests):
                groups += self._generate(batch, version)
            self.requests.forward(ready, self.results, groups)  # every result of the read with its acks, at once
        produced = sum(len(group) for group in groups)
        self.counts["samples"] += produced
        return produced

    def _generate(self, reqs: list[RequestRecord], version: int) -> list[list[RolloutResult]]:
        """One engine call with the requests' one `sampling`, as it came: the n samples of each request, one group
        (stream entry) per request."""
        sampling = reqs[0].sampling
        start = time.perf_counter()
        outputs = self.engine.generate([unpack_tokens(r.prompt_token_ids).tolist() for r in reqs], sampling)
        share = (time.perf_counter() - start) / max(1, sampling.n * len(reqs))
        self.counts["tokens"] += sum(len(g.token_ids) for gens in outputs for g in gens)
        return [[RolloutResult(run=r.run, step=r.step, prompt_id=r.prompt_id,
                               sample_index=r.first_index + g.sample_index, policy_version=version, prompt_token_ids=r.prompt_token_ids,
                               token_ids=pack_tokens(g.token_ids), text=g.text, finish_reason=g.finish_reason,
                               generation_seconds=share, worker=self.worker, incarnation=INCARNATION,
                               logprobs=b"" if g.logprobs is None else pack_logprobs(g.logprobs))
                 for g in gens]
                for r, gens in zip(reqs, outputs)]


class VerifierService:
    """Scores each result against its prompt's gold answer with the reward pool."""

    def __init__(self, pool, answers: Mapping[str, Any], results: WorkQueue, rewards: WorkQueue, batch: int = 512):
        self.pool, self.answers, self.results, self.rewards = pool, answers, results, rewards
        self.batch = batch
        self.counts: Counter[str] = Counter()

    def release_held(self) -> int:
        """Hand back the results of a failed pass (see WorkQueue.release_held)."""
        return self.results.release_held()

    def serve_once(self, block_ms: int | None = None) -> int:
        deliveries = self.results.take(self.batch, block_ms=block_ms)
        if not deliveries:
            return 0
        known = []
        for d in deliveries:
            if all(r.prompt_id in self.answers for r in d.records):
                known.append(d)
            else:  # no gold answer: a poison record, retried then dead-lettered, never a hang
                missing = next(r.prompt_id for r in d.records if r.prompt_id not in self.answers)
                self.results.fail(d, KeyError(f"no gold answer for prompt id {missing!r}"))
        to_score = [r for d in known for r in d.records if not is_truncated(r.finish_reason)]
        outcomes = self.pool.score_batch([(r.text, self.answers[r.prompt_id]) for r in to_score])
        verdict = {id(r): o for r, o in zip(to_score, outcomes)}
        # One note per sample, pointing at the sample in the results stream: the coordinator reads it back there.
        groups = [[self._reward(r, d.id, i, verdict.get(id(r))) for i, r in enumerate(d.records)] for d in known]
        self.results.forward(known, self.rewards, groups)
        return sum(len(g) for g in groups)

    def _reward(self, result: RolloutResult, entry_id: str, position: int, outcome) -> RewardNote:
        """The reward note of one result; truncated responses get 0 without a verdict (algorithm step 5)."""
        self.counts["verified"] += 1
        if outcome is None:
            self.counts["truncated"] += 1
            return RewardNote.of(result, entry_id, position, TRUNCATED_REWARD, 0.0, False)
        self.counts["timeouts"] += int(outcome.timed_out)
        self.counts["errors"] += int(outcome.error is not None)
        return RewardNote.of(result, entry_id, position, float(outcome.reward), outcome.seconds,
                             bool(outcome.timed_out), outcome.error is not None)


def serve_forever(service, stop: threading.Event, name: str, idle_block_ms: int = 200,
                  backoff: Backoff | None = None, log_every_s: float = LOG_EVERY_S,
                  fatal: Callable[[BaseException], bool] | None = None,
                  on_fatal: Callable[[BaseException], None] | None = None) -> None:
    """Run a service's loop until `stop` is set. A failed pass hands its entries back at once (any worker may
    serve them again), then the loop waits with exponential backoff (RETRY_BASE_S doubling up to RETRY_CAP_S,
    reset by a success); the log holds one traceback per failure streak and a summary line per log_every_s.

    A failure that `fatal(exc)` calls fatal (the rollout worker's: its engine died) is not one bad batch: the
    entries are handed back, `on_fatal(exc)` is called (the actor ends its process, so that Ray restarts it
    with a fresh engine) and the loop ends."""
    backoff = backoff or Backoff(RETRY_BASE_S, RETRY_CAP_S)
    failures = FailureLog(log, name, every_s=log_every_s)
    while not stop.is_set():
        try:
            service.serve_once(block_ms=idle_block_ms)
        except Exception as exc:  # noqa: BLE001 - a worker must outlive one bad batch; entries are redelivered
            service.release_held()
            if fatal is not None and fatal(exc):
                log.error("%s: fatal failure, the worker ends: %r", name, exc)
                stop.set()
                if on_fatal is not None:
                    on_fatal(exc)
                return
            delay = backoff.next()
            failures.failed(exc, delay)
            stop.wait(delay)
        else:
            if backoff.failures:
                failures.recovered()
                backoff.reset()
