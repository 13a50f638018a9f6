"""Exactly-once collection of one step's batch from at-least-once deliveries (services.streams.queues).

Every record carries the key (run, step, prompt id, sample index, policy version). The coordinator offers
what the reward stream delivers; the collector keeps one record per (prompt id, sample index) the step
asked for and counts the rest as dropped, so a redelivery, a straggler of an earlier step or a sample of
other weights never enters the batch. Reward notes it keeps are joined with the samples they point at in
the results stream (`WorkQueue.join`).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Sequence

from services.streams.payloads import Record, RewardNote


class StepCollector:
    """The records of one step's batch, exactly one per (prompt id, sample index).

    Offered records of another run, step or policy version, of keys not expected, and repeats of a key
    already held are dropped and counted: delivery is at-least-once, collection is exactly-once. A
    RewardNote that is kept is joined with its result by `resolve` (the results queue's `join`), so only
    the notes that enter the batch cost a read of their sample; the batch holds RewardRecords.

        collector = StepCollector(run, step, policy_version, {(pid, j) for pid in prompt_ids for j in range(n)},
                                  resolve=results.join)
        while not collector.complete:
            deliveries = rewards.take(512)
            collector.offer_all(record for d in deliveries for record in d.records)
            rewards.ack(deliveries)
    """

    def __init__(self, run: str, step: int, policy_version: int, expected: Iterable[tuple[str, int]],
                 resolve: Callable[[Sequence[RewardNote]], Sequence[Record | None]] | None = None):
        self.run, self.step, self.policy_version = run, step, policy_version
        self.expected = frozenset(expected)
        self.resolve = resolve
        self.records: dict[tuple[str, int], Record] = {}
        self.duplicates = 0  # a key already collected (redelivery, or a retried write)
        self.stale_step = 0  # a record of another step (a late straggler of a committed step)
        self.stale_version = 0  # generated with other weights than this step's policy: never trained on
        self.unexpected = 0  # another run, or a (prompt id, sample index) this step did not ask for
        self.unresolved = 0  # a note whose result is gone from the results stream: the sample stays missing
        # stale_step + stale_version by the process that generated them, "{worker}@{incarnation}" (a node cut off
        # and back writes late: services/incarnations.py names the node of each incarnation)
        self.stale_by_producer: Counter[str] = Counter()
        # notes dropped as stale or duplicates by the verifier that wrote them, "{verifier}@{incarnation}" (a verifier
        # that froze, its results handed to another meanwhile, writes its notes late)
        self.late_by_verifier: Counter[str] = Counter()

    def offer(self, record: Record) -> bool:
        """Keep the record if it belongs to this batch and is new; True when kept."""
        return self.offer_all([record]) == 1

    def offer_all(self, records: Iterable[Record]) -> int:
        """Offer each record, then join the kept notes with their results; returns how many were kept."""
        kept, notes = 0, []
        for record in records:
            if self._admit(record):
                kept += 1
                if isinstance(record, RewardNote):
                    notes.append(record)
        if notes:
            if self.resolve is None:
                for note in notes:
                    del self.records[(note.prompt_id, note.sample_index)]
                raise TypeError("StepCollector was offered RewardNotes but has no resolve (pass the results "
                                "queue's join) to read their samples")
            for note, record in zip(notes, self.resolve(notes)):
                key = (note.prompt_id, note.sample_index)
                if record is None:  # the result was trimmed or lost: the sample stays missing
                    del self.records[key]
                    self.unresolved += 1
                    kept -= 1
                else:
                    self.records[key] = record
        return kept

    def _admit(self, record: Record) -> bool:
        key = (record.prompt_id, record.sample_index)
        if record.run != self.run:
            self.unexpected += 1
            return False
        if record.step != self.step:
            self.stale_step += 1
            self.stale_by_producer[producer(record)] += 1
        elif record.policy_version != self.policy_version:
            self.stale_version += 1
            self.stale_by_producer[producer(record)] += 1
        elif key not in self.expected:
            self.unexpected += 1
            return False
        elif key in self.records:
            self.duplicates += 1
        else:
            self.records[key] = record
            return True
        if getattr(record, "verifier", ""):  # a late note: stale, or the second copy of one
            self.late_by_verifier[record.verifier] += 1
        return False

    @property
    def complete(self) -> bool:
        return len(self.records) == len(self.expected)

    @property
    def missing(self) -> set[tuple[str, int]]:
        return set(self.expected - self.records.keys())

    def batch(self) -> list[Record]:
        """The collected records ordered by (prompt id, sample index)."""
        return [self.records[key] for key in sorted(self.records)]

    def dropped(self) -> dict[str, int]:
        return {"duplicates": self.duplicates, "stale_step": self.stale_step,
                "stale_version": self.stale_version, "unexpected": self.unexpected, "unresolved": self.unresolved}


def producer(record: Record) -> str:
    """Who generated a record: "{worker}@{incarnation}" ("?" for what it does not carry)."""
    return f"{getattr(record, 'worker', '') or '?'}@{getattr(record, 'incarnation', '') or '?'}"
