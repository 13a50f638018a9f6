"""The serving loops of the rollout and verifier workers, independent of Ray.

    service = RolloutService(engine, requests, results)      # WorkQueues of services.streams.queues
    while running: service.serve_once()                      # take -> generate -> forward (put + ack)

    service = VerifierService(pool, answers, results, rewards)
    while running: service.serve_once()                      # take -> score -> forward

On-policy is enforced here: a request is served only by weights of exactly its `policy_version`. A request
for an older version is acknowledged and counted, never generated; one for a newer version is handed back
so a worker that already holds those weights takes it (without counting a delivery: a worker left behind by a
weight sync, frozen meanwhile, must not dead-letter the step's requests). Truncated responses are rewarded 0
(algorithm step 5).

Each service says how long it has gone without progress in its pass under way and how many samples it is working
on (`progress`): a rollout worker progresses with each engine call (one per request with rollout.deterministic,
one per pass otherwise), a verifier with each pass. Its heartbeat carries that to the coordinator, which hands the
work of a worker without progress to the others (services/streams/stragglers.py).
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


class Progress:
    """The pass under way of a serving loop: since when it has made no progress, on how many samples."""

    pass_since: float | None = None  # monotonic time the pass under way took its work; None while waiting for work
    busy_since = 0.0  # monotonic time of its last progress (it took its work, an engine call ended)
    busy_samples = 0  # samples it is working on: an engine call's (requests x n), a verifier pass's results

    def progress(self) -> dict:
        """{"busy_s": seconds without progress in the pass under way, "pass_s": that pass's age (both 0 while
        waiting for work), "samples": the samples it is working on}."""
        since, now = self.pass_since, time.monotonic()
        if since is None:
            return {"busy_s": 0.0, "pass_s": 0.0, "samples": 0}
        return {"busy_s": round(now - self.busy_since, 3), "pass_s": round(now - since, 3),
                "samples": self.busy_samples}

    def _busy(self, samples: int, new_pass: bool = False) -> None:
        """Progress: a pass took its work (`new_pass`), or its next engine call on `samples` begins."""
        self.busy_since, self.busy_samples = time.monotonic(), samples
        if new_pass:
            self.pass_since = self.busy_since


class RolloutService(Progress):
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
        self._busy(sum(r.n for d in deliveries for r in d.records), new_pass=True)
        try:
            return self._serve(deliveries)
        finally:
            self.pass_since = None

    def _serve(self, deliveries: list) -> int:
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
                self.requests.release(ahead, count_delivery=False)
                self.counts["requests_ahead_of_weights"] += sum(len(d.records) for d in ahead)
            if not ready:
                return 0
            groups: list[list[RolloutResult]] = []
            for batch in by_sampling([r for d in ready for r in d.records], self.batch_requests):
                self._busy(sum(r.n for r in batch))  # progress: each engine call starts afresh
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


class VerifierService(Progress):
    """Scores each result against its prompt's gold answer with the reward pool. Its notes name it (`verifier`,
    "verifier-0@<incarnation>"): a late note of a verifier that froze is counted by it."""

    def __init__(self, pool, answers: Mapping[str, Any], results: WorkQueue, rewards: WorkQueue, batch: int = 512,
                 verifier: str = ""):
        self.pool, self.answers, self.results, self.rewards = pool, answers, results, rewards
        self.batch, self.verifier = batch, f"{verifier}@{INCARNATION}" if verifier else ""
        self.counts: Counter[str] = Counter()

    def release_held(self) -> int:
        """Hand back the results of a failed pass (see WorkQueue.release_held)."""
        return self.results.release_held()

    def serve_once(self, block_ms: int | None = None) -> int:
        deliveries = self.results.take(self.batch, block_ms=block_ms)
        if not deliveries:
            return 0
        self._busy(sum(len(d.records) for d in deliveries), new_pass=True)
        try:
            return self._serve(deliveries)
        finally:
            self.pass_since = None

    def _serve(self, deliveries: list) -> int:
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
            return RewardNote.of(result, entry_id, position, TRUNCATED_REWARD, 0.0, False, verifier=self.verifier)
        self.counts["timeouts"] += int(outcome.timed_out)
        self.counts["errors"] += int(outcome.error is not None)
        return RewardNote.of(result, entry_id, position, float(outcome.reward), outcome.seconds,
                             bool(outcome.timed_out), outcome.error is not None, verifier=self.verifier)


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
