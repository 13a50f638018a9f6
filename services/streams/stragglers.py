"""Workers that make no progress: their work handed to the live workers, and, past a longer timeout, named for a
restart. The coordinator's side, run while it waits for a step's samples (`RolloutClient`):

    watch = StragglerWatch(cfg, client)          # the run's request and result streams, its heartbeats
    watch.poll()                                 # every second: each worker's progress from its heartbeat
    watch.hand_over(collector.missing)           # copies of what stragglers hold, for the live workers
    watch.straggling("rollout"); watch.stuck()   # left out of the next chunks and weight syncs; to restart

A worker's progress comes from its heartbeat (services/incarnations.py): each beat says how long the pass under
way of its serving loop has run (`busy_s`) and how many samples it holds; a process that stopped (SIGSTOP, a frozen
node) or died beats no more. A worker has made no progress for `stalled_s`: the pass under way's age (its age at
the last beat plus the time since), or, idle, the time since its last beat less a beat's grace. It is a straggler
when that exceeds its straggler timeout (`rollout.straggler_timeout_s`, `verifier.straggler_timeout_s`; null:
max(STRAGGLER_MIN_S, STRAGGLER_FACTOR x the samples its pass holds x the fleet's measured seconds per sample) and
stuck past `*.stuck_timeout_s`.

An entry a consumer holds is handed over when it has been held past the straggler timeout of its samples and is
not being served by a healthy pass: its consumer is a straggler, beats no heartbeat, or its pass under way began
after the entry was delivered (a restarted worker: the entry is its previous process's). What is still missing of
it is put again as new entries (a rollout chunk cut for the live workers): the first copy verified is collected,
the other is dropped as a duplicate or, after the step commits, as stale, counted by its producer
(services/streams/collector.py). The entry itself stays with its holder, which acknowledges it if it thaws; an entry
held past the visibility timeout is not copied: any consumer reclaims it (XAUTOCLAIM). Nothing is ever taken away
from a worker, so a wrongly suspected one costs only the duplicate work.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Iterable

from pcl.engines.batching import request_chunks
from services.incarnations import BEAT_S, read_incarnations
from services.streams.topology import open_queue

log = logging.getLogger(__name__)

STRAGGLER_MIN_S = 10.0  # a derived straggler timeout is never shorter (beats come every second, on loaded hosts late)
STRAGGLER_FACTOR = 3.0  # a pass this many times its expected length is a straggler's
SILENT_GRACE_S = 2 * BEAT_S  # an idle worker's beat this late is not yet a stall
BUSY_SLACK_S = 2.0  # a pass that took an entry began within this of the entry's delivery
RATE_WINDOW = 8  # generation calls the measured seconds per sample average over
ROLES = {"rollout": "rollout_requests", "verifier": "rollout_results"}  # a role and the stream its members take


@dataclass(frozen=True)
class WorkerState:
    """One worker's progress, from the newest incarnation of its instance in the heartbeat registry."""

    instance: str  # "rollout-1": its consumer name in the stream it takes
    incarnation: str  # the process
    actor: str  # its Ray actor's id ("" outside Ray): a restart is asked of that actor only
    busy_s: float  # the pass under way's age now (0: waiting for work)
    samples: int  # the samples that pass holds
    stalled_s: float  # how long it has made no progress: the pass's age, or (idle) its silence past a beat's grace


def read_states(client, run: str) -> dict[str, WorkerState]:
    """The progress of every rollout worker and verifier of the run, by instance (its newest incarnation)."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    newest: dict[str, dict] = {}
    for entry in read_incarnations(client, run):  # first beat first: the last one per instance is its newest
        if entry.get("role") in ROLES:
            newest[entry["instance"]] = entry
    states = {}
    for instance, entry in newest.items():
        if entry["ended_ms"] is not None:  # it stopped on purpose (the run is ending): no straggler
            continue
        silent = max(0.0, (now_ms - entry["last_ms"]) / 1000)
        progress = entry.get("progress") or {}
        busy = float(progress.get("busy_s", 0.0))
        busy_now = busy + silent if busy > 0 else 0.0
        stalled = busy_now if busy > 0 else max(0.0, silent - SILENT_GRACE_S)
        states[instance] = WorkerState(instance, entry["incarnation"], entry.get("actor", ""), busy_now,
                                       int(progress.get("samples", 0)), stalled)
    return states


class StragglerTimeout:
    """One role's straggler timeout: the setting, or derived from the seconds per sample measured on the work it
    finished (`observe`)."""

    def __init__(self, fixed: float | None, stuck_s: float | None):
        self.fixed, self.stuck_s = fixed, stuck_s
        self.window: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW)  # (samples, seconds) of recent calls

    def observe(self, samples: int, seconds: float) -> None:
        if samples > 0:
            self.window.append((samples, seconds))

    @property
    def seconds_per_sample(self) -> float | None:
        samples = sum(n for n, _ in self.window)
        return sum(s for _, s in self.window) / samples if samples else None

    def for_samples(self, samples: int) -> float | None:
        """The timeout of a pass holding `samples`; None (nothing is handed over) while no rate is measured."""
        if self.fixed is not None:
            return self.fixed
        rate = self.seconds_per_sample
        if samples and rate is None:
            return None
        return max(STRAGGLER_MIN_S, STRAGGLER_FACTOR * samples * (rate or 0.0))


class StragglerWatch:
    """The run's rollout workers and verifiers watched for progress; stragglers' work handed to the others."""

    def __init__(self, cfg, client):
        self.cfg, self.client, self.run = cfg, client, cfg.run.name
        self.queues = {role: open_queue(client, self.run, stream, "coordinator", cfg.redis)
                       for role, stream in ROLES.items()}
        self.timeouts = {"rollout": StragglerTimeout(cfg.rollout.straggler_timeout_s, cfg.rollout.stuck_timeout_s),
                         "verifier": StragglerTimeout(cfg.verifier.straggler_timeout_s,
                                                      cfg.verifier.stuck_timeout_s)}
        self.states: dict[str, WorkerState] = {}
        self.handed: set[str] = set()  # entries copied already (the streams are trimmed at each commit)
        self.handed_over: Counter[str] = Counter()  # samples handed over, by the worker they were taken from

    def poll(self) -> None:
        """Read every worker's progress (one read of the heartbeat registry)."""
        self.states = read_states(self.client, self.run)

    def straggling(self, role: str) -> set[str]:
        """Instances of `role` without progress for their straggler timeout (a silent idle one included)."""
        timeout = self.timeouts[role]
        out = set()
        for name, state in self.states.items():
            limit = timeout.for_samples(state.samples)
            if name.startswith(f"{role}-") and limit is not None and state.stalled_s > limit:
                out.add(name)
        return out

    def stuck(self) -> list[WorkerState]:
        """Workers without progress for their role's stuck timeout: to be restarted."""
        return [state for name, state in sorted(self.states.items())
                if (limit := self.timeouts[name.rsplit("-", 1)[0]].stuck_s) is not None and state.stalled_s > limit]

    def observe(self, batch: Iterable) -> None:
        """Measure the seconds per sample of the work in a collected batch (RewardRecords)."""
        records = list(batch)
        self.timeouts["rollout"].observe(len(records), sum(r.generation_seconds for r in records))
        self.timeouts["verifier"].observe(len(records), sum(r.verifier_seconds for r in records))

    def committed(self) -> None:
        """A step committed: its entries are trimmed, so the ids copied are forgotten."""
        self.handed.clear()

    def hand_over(self, missing: set[tuple[str, int]]) -> int:
        """Copy what stragglers hold of the `missing` samples for the live workers; returns the samples copied."""
        return sum(self._hand_over(role, missing) for role in ROLES) if missing else 0

    def _hand_over(self, role: str, missing: set[tuple[str, int]]) -> int:
        queue, timeout = self.queues[role], self.timeouts[role]
        floor = min(timeout.fixed or STRAGGLER_MIN_S, STRAGGLER_MIN_S)
        held = [(entry_id, consumer, idle_ms / 1000) for entry_id, consumer, idle_ms in queue.held()
                if entry_id not in self.handed and floor < idle_ms / 1000 and idle_ms < queue.visibility_ms]
        if not held:
            return 0
        entries = queue.read_entries([entry_id for entry_id, _, _ in held])
        copies: list[tuple[str, str, list]] = []
        for entry_id, consumer, idle_s in held:
            records = entries[entry_id] or []
            limit = timeout.for_samples(sum(_samples(r) for r in records))
            if limit is None or idle_s <= limit or self._served(consumer, idle_s, limit):
                continue
            wanted = [r for r in records if any(key in missing for key in _keys(r))]
            self.handed.add(entry_id)
            if wanted:
                copies.append((entry_id, consumer, wanted))
        return self._put_copies(role, copies)

    def _served(self, consumer: str, idle_s: float, limit: float) -> bool:
        """Whether `consumer` serves the entry in a healthy pass: the pass under way took it and is within `limit`."""
        state = self.states.get(consumer)
        return state is not None and abs(state.busy_s - idle_s) <= BUSY_SLACK_S and state.stalled_s <= limit

    def _put_copies(self, role: str, copies: list[tuple[str, str, list]]) -> int:
        if not copies:
            return 0
        queue = self.queues[role]
        records = [r for _, _, wanted in copies for r in wanted]
        if role == "rollout":  # one chunk per live worker, as a step's requests are cut
            live = max(1, self.cfg.rollout.num_workers - len(self.straggling(role) | {c for _, c, _ in copies}))
            queue.put(request_chunks(records, live, self.cfg.rollout.max_in_flight))
        else:  # each result group as it was
            queue.put([wanted for _, _, wanted in copies])
        copied = 0
        for entry_id, consumer, wanted in copies:
            samples = sum(_samples(r) for r in wanted)
            self.handed_over[consumer] += samples
            copied += samples
            log.warning("%s: %s made no progress on entry %s for its straggler timeout: %d samples handed to the "
                        "live workers", queue.stream, consumer, entry_id, samples)
        return copied


def _samples(record) -> int:
    """Samples a record stands for: a request's n, one for a result."""
    return record.n if hasattr(record, "sampling") else 1


def _keys(record) -> list[tuple[str, int]]:
    """The (prompt id, sample index) keys a request or a result stands for."""
    if hasattr(record, "sampling"):
        return [(record.prompt_id, record.first_index + j) for j in range(record.n)]
    return [(record.prompt_id, record.sample_index)]
