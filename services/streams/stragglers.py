"""Workers that make no progress: their work handed to the live workers, and, past a longer timeout, named for a
restart. The coordinator's side, run while it waits for a step's samples (`RolloutClient`):

    watch = StragglerWatch(cfg, client)          # the run's request and result streams, its heartbeats
    watch.poll()                                 # every second: each worker's progress from its heartbeat
    watch.hand_over(collector.missing)           # copies of what stragglers hold, for the live workers
    watch.straggling("rollout"); watch.stuck()   # left out of the next chunks and weight syncs; to restart

A worker's progress comes from its heartbeat (services/incarnations.py): each beat says how long its serving loop
has gone without progress in the pass under way (`busy_s`: since it took its work or its last engine call ended)
and on how many samples (an engine call's, a verifier pass's); a process that stopped (SIGSTOP, a frozen node) or
died beats no more. A worker has made no progress for `stalled_s`: that time (at the last beat, plus the time
since), or, idle, the time since its last beat less a beat's grace. It is a straggler when that exceeds its
straggler timeout (`rollout.straggler_timeout_s`, `verifier.straggler_timeout_s`; null: max(STRAGGLER_MIN_S,
STRAGGLER_FACTOR x the samples it works on x the fleet's measured seconds per sample), and stuck past
`*.stuck_timeout_s` when it is a straggler too (so a healthy long engine call is never restarted).

An entry a consumer holds is handed over when no healthy pass serves it: the pass of its consumer that took it
(the pass that began when the entry was delivered) has made no progress for its straggler timeout, or no pass of
its consumer took it (a restarted worker: the entry is its previous process's; a consumer without a heartbeat)
and it has been held past the straggler timeout of its samples. What is still missing of
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
    busy_s: float  # how long its pass under way has made no progress, now (0: waiting for work)
    pass_s: float  # that pass's age, now: the entries it took were delivered about this long ago
    samples: int  # the samples it works on (an engine call's, a verifier pass's)
    stalled_s: float  # how long it has made no progress: busy_s, or (idle) its silence past a beat's grace


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
        busy, in_pass = float(progress.get("busy_s", 0.0)), float(progress.get("pass_s", 0.0))
        busy_now = busy + silent if in_pass > 0 else 0.0
        stalled = busy_now if in_pass > 0 else max(0.0, silent - SILENT_GRACE_S)
        states[instance] = WorkerState(instance, entry["incarnation"], entry.get("actor", ""), busy_now,
                                       in_pass + silent if in_pass > 0 else 0.0, int(progress.get("samples", 0)),
                                       stalled)
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
        """Workers without progress for their role's stuck timeout, and for their straggler timeout (where it is
        known): to be restarted."""
        out = []
        for name, state in sorted(self.states.items()):
            timeout = self.timeouts[name.rsplit("-", 1)[0]]
            straggler = timeout.for_samples(state.samples)
            if timeout.stuck_s is not None and state.stalled_s > max(timeout.stuck_s, straggler or 0.0):
                out.append(state)
        return out

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
        floor = min(timeout.fixed or STRAGGLER_MIN_S, STRAGGLER_MIN_S)  # no limit is shorter
        held = [(entry_id, consumer, idle_ms / 1000) for entry_id, consumer, idle_ms in queue.held()
                if entry_id not in self.handed and floor < idle_ms / 1000 and idle_ms < queue.visibility_ms]
        if not held:
            return 0
        entries = queue.read_entries([entry_id for entry_id, _, _ in held])
        copies: list[tuple[str, str, list]] = []
        for entry_id, consumer, idle_s in held:
            records = entries[entry_id] or []
            if not self._abandoned(role, consumer, idle_s, sum(_samples(r) for r in records)):
                continue
            wanted = [r for r in records if any(key in missing for key in _keys(r))]
            self.handed.add(entry_id)
            if wanted:
                copies.append((entry_id, consumer, wanted))
        return self._put_copies(role, copies)

    def _abandoned(self, role: str, consumer: str, idle_s: float, samples: int) -> bool:
        """Whether no healthy pass serves an entry of `samples` that `consumer` has held for idle_s."""
        timeout, state = self.timeouts[role], self.states.get(consumer)
        if state is None or abs(state.pass_s - idle_s) > BUSY_SLACK_S:  # no pass of its holder took it
            limit = timeout.for_samples(samples)
            return limit is not None and idle_s > limit
        limit = timeout.for_samples(state.samples)  # the pass that took it, by its engine call under way
        return limit is not None and state.stalled_s > limit

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
