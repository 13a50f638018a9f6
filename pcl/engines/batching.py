"""How a generation call's requests become engine calls, the same for the rollout fleet and for one process.

    requests = seeded(requests, cfg.run.seed, run, step)          # rollout.deterministic: a seed per request
    for chunk in request_chunks(requests, workers, max_in_flight):  # a stream entry each (one worker's share)
        for batch in by_sampling(chunk, max_in_flight):             # one engine call each
            engine.generate([list(r.prompt_token_ids) for r in batch], batch[0].sampling)

The rollout client (`services.streams.rollout_client`) cuts a step's requests into stream entries with
`request_chunks`; a rollout worker (`services.streams.workers.RolloutService`) generates each entry's requests in
engine calls of one `sampling` each (`by_sampling`). The in-process rollouts of `pcl train --local`
(`pcl.loop.local.ports.EngineRollouts`) make the very same calls, in the same order, on their one engine: with one
rollout worker, both paths give the engine the same batches. Items are anything with a `sampling`
(`pcl.engines.request.RolloutRequest`, the stream's `RequestRecord`).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Sequence, TypeVar

from pcl.engines.request import RolloutRequest, SamplingParams

T = TypeVar("T")


def request_seed(seed: int, run: str, step: int, prompt_id: str, first_index: int) -> int:
    """The sampling seed of one request under rollout.deterministic: a pure function of its key."""
    digest = hashlib.blake2b(f"{seed}|{run}|{step}|{prompt_id}|{first_index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def seeded(requests: Sequence[RolloutRequest], seed: int, run: str, step: int) -> list[RolloutRequest]:
    """rollout.deterministic: each request with a seed of its own (`request_seed` of run.seed and its key; `run` is
    the run's name, `{name}:{tag}` for work that is not the step's batch), so its samples depend on nothing else:
    not on batching, not on which worker serves it."""
    return [replace(r, sampling=replace(r.sampling, seed=request_seed(seed, run, step, r.prompt_id, r.first_index)))
            for r in requests]


def request_chunks(requests: list[T], workers: int, max_in_flight: int) -> list[list[T]]:
    """A step's requests cut into stream entries, one chunk each: as many chunks as workers (each worker takes one
    entry per read, so every worker gets a share), more when a chunk would exceed max_in_flight requests; chunk
    sizes differ by one at most."""
    if not requests:
        return []
    count = min(len(requests), max(workers, 1, -(-len(requests) // max_in_flight)))
    size, extra = divmod(len(requests), count)
    chunks, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        chunks.append(requests[start:end])
        start = end
    return chunks


def by_sampling(requests: list[T], batch: int) -> list[list[T]]:
    """Requests with equal `sampling` (n included; SamplingParams is hashable) in engine calls of at most `batch`,
    in order of each sampling's first request."""
    groups: dict[SamplingParams, list[T]] = {}
    for r in requests:
        groups.setdefault(r.sampling, []).append(r)  # type: ignore[attr-defined]
    return [group[i:i + batch] for group in groups.values() for i in range(0, len(group), max(1, batch))]
