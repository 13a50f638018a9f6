"""What the coordinator does when the output of one of its requests is refused at the wire.

A result whose engine log-probabilities are NaN, infinite or above 0 does not decode (`payloads.BadLogprobs`): the
verifier that takes it dead-letters the whole entry (the request's n samples) with the refused record's key
(`services.streams.queues`), and none of those samples reaches the step's collector. While a generation call waits
for its samples, `Refusals.check` reads the results stream's new dead letters: the first refusal of a request's
output asks for the request again (a sampling engine draws new samples); a second refusal of the same request, which
a deterministic engine (`rollout.deterministic`) always gives, stops the run with `RefusedTwice`, naming the request
and the cause. Restarting from a checkpoint would only generate the same output again.

    refusals = Refusals(results, records)            # before the records are put: later letters are this call's
    while not collector.complete:
        ...
        again = refusals.check(collector.missing)    # the requests to put again; RefusedTwice on a second refusal
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from typing import Collection, Sequence

from services.streams.payloads import RecordKey, RequestRecord
from services.streams.upkeep import StreamUpkeep

log = logging.getLogger(__name__)


class RefusedTwice(RuntimeError):
    """The output of one request was refused at the wire twice: its engine gives numbers no learner can use, and
    asking again, or restarting the run, gives the same. Not recoverable (`entrypoints.train.recoverable`)."""


class Refusals:
    """The refusals of one generation call's outputs, counted per request (see the module docstring)."""

    def __init__(self, results: StreamUpkeep, records: Sequence[RequestRecord]):
        """results: the results stream, whose dead letters name refused records; records: the call's requests."""
        self.results = results
        self.cursor = results.dead_tail_id()  # letters written before the call are not about its records
        self.by_prompt: dict[str, list[RequestRecord]] = {}
        for record in records:
            self.by_prompt.setdefault(record.prompt_id, []).append(record)
        self.refused: Counter[tuple[str, int]] = Counter()  # (prompt id, first index) -> refusals of its output
        # Digests of refused payloads: an output written twice (a retried write) is one refusal, while a request
        # generated again differs at least in its timing fields.
        self.seen: set[bytes] = set()

    def check(self, missing: Collection[tuple[str, int]]) -> list[RequestRecord]:
        """The requests whose output was refused for the first time since the last check (put them again), counting
        only refusals of samples still `missing` ((prompt id, sample index) pairs); RefusedTwice on a request's
        second refusal."""
        again: list[RequestRecord] = []
        while letters := self.results.dead_letters_after(self.cursor):
            self.cursor = letters[-1][0]
            for _, letter in letters:
                request = self._request_of(letter, missing)
                digest = hashlib.blake2b(letter["payload"], digest_size=16).digest()
                if request is None or digest in self.seen:
                    continue
                self.seen.add(digest)
                ident = (request.prompt_id, request.first_index)
                self.refused[ident] += 1
                if self.refused[ident] > 1:
                    raise RefusedTwice(self._twice(request, str(letter["error"])))
                log.warning("step %d: the output of request %r (samples %s) was refused at the wire (%s); asking for "
                            "it again", request.step, request.prompt_id, _samples(request), letter["error"])
                again.append(request)
        return again

    def _request_of(self, letter: dict[str, object], missing: Collection[tuple[str, int]]) -> RequestRecord | None:
        """The request of this call whose still missing sample the letter names, if any."""
        if "key" not in letter:
            return None
        key = RecordKey(*json.loads(str(letter["key"])))
        for request in self.by_prompt.get(key.prompt_id, ()):
            if ((key.run, key.step, key.policy_version) == (request.run, request.step, request.policy_version)
                    and request.first_index <= key.sample_index < request.first_index + request.n
                    and (key.prompt_id, key.sample_index) in missing):
                return request
        return None

    def _twice(self, request: RequestRecord, error: str) -> str:
        return (f"step {request.step}: the output of request {request.prompt_id!r} (run {request.run!r}, samples "
                f"{_samples(request)}, policy version {request.policy_version}) was refused at the wire twice, "
                f"the second time as {error}. The engine gives this request numbers the learner cannot use, and a "
                f"deterministic engine (rollout.deterministic) gives them on every retry and restart: the run stops. "
                f"The refused entries are in the stream {self.results.dead_stream!r}.")


def _samples(request: RequestRecord) -> str:
    return f"{request.first_index}-{request.first_index + request.n - 1}"
