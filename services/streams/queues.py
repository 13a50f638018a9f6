"""Work queues between actors on Redis Streams with consumer groups; the only place that uses streams.

The streams of a run, their groups and who writes and takes each are declared in services/streams/topology.py, which
opens every queue (`open_queue`, `open_role`) from that declaration.

A worker's loop, with at-least-once delivery and the ack written together with the downstream record:

    requests = open_queue(client, run, "rollout_requests", "w1", cfg.redis)   # services.streams.topology
    results = open_queue(client, run, "rollout_results", "w1", cfg.redis)
    while running:
        for delivery in requests.take(8):
            try:  # the n samples of the request go out as one entry, with the request's ack, in one MULTI
                requests.forward([delivery], results, [generate(delivery.record)])
            except Exception as exc:
                requests.fail(delivery, exc)  # retried, dead-lettered after max_deliveries failures

An entry holds one record or a group of records (`put([group, ...])` with a group a list of records,
typically one prompt's n samples): grouping divides the per-entry cost of Redis and its client by the
group size. A delivery is one entry; a failing group is split into single records so that one poison
record never takes its neighbours down with it.

`take` first reclaims entries that another consumer has held past the visibility timeout (XAUTOCLAIM),
then reads new ones (XREADGROUP, blocking). An entry that fails `max_deliveries` times, or does not
decode, goes to `{stream}:dead` with its error; dead-letter streams are capped by bytes and by count. What became
of every entry (put, acknowledged, dead-lettered, trimmed or purged unacknowledged) is counted in `{stream}:counts`,
each count in the same Lua script or MULTI/EXEC as what it counts (services/streams/counts.py). Every call retries with exponential backoff while Redis is unreachable (a
restart) or full (maxmemory reached: backpressure, the consumer keeps what it holds and waits), and recreates
the group if the stream vanished. A failed pass hands its deliveries back with `release_held()`. When a step
commits, `trim_committed()` drops every entry the stream holds, and their pending entries, so memory stays
bounded. `services.streams.collector.StepCollector` turns at-least-once into exactly-once
per step.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TypeVar, Union

import redis

from services.streams.counts import CountedStream
from services.streams.heap import keep_freed_heap
from services.streams.redis_full import MemoryWait, cap_stream_bytes
from services.streams.payloads import PayloadError, Record, RecordKey, decode_entry, encode_entry
from services.streams.upkeep import PAYLOAD_FIELD, StreamUpkeep, id_key

log = logging.getLogger(__name__)

PUT_CHUNK = 512  # XADDs per pipeline round trip
DEAD_LETTER_MAX_BYTES = 64 * 2**20  # a dead-letter stream is trimmed (oldest first) past this much Redis memory
FULL_TIMEOUT_S = 600.0  # how long a write waits for a full Redis (maxmemory reached) to free memory
T = TypeVar("T")
Entry = Union[Record, Sequence[Record]]  # what one stream entry holds: a record or a group of records


class QueueUnavailable(RuntimeError):
    """Redis stayed unreachable for longer than the queue's reconnect timeout."""


class RedisFull(QueueUnavailable):
    """Redis refused writes (maxmemory reached) for longer than the queue's full_timeout_s."""


@dataclass(slots=True)
class Delivery:
    """One entry handed to this consumer; ack, forward or fail it."""

    id: str  # stream entry id, "milliseconds-sequence"
    records: list[Record]  # the decoded entry: one record, or a group
    deliveries: int  # times this entry has been delivered, this one included (1 on a first read)
    payload: bytes  # the encoded entry, kept for the dead-letter stream

    @property
    def record(self) -> Record:
        """The record of a single-record entry."""
        if len(self.records) != 1:
            raise ValueError(f"entry {self.id} holds {len(self.records)} records; use .records")
        return self.records[0]


class WorkQueue(StreamUpkeep):
    """One stream seen by one consumer of one group: put, take, ack / forward / fail; reading back, inspecting and
    trimming come from services.streams.upkeep.StreamUpkeep.

    visibility_timeout_s: an entry held this long without ack by any consumer is reclaimed by another.
    max_deliveries: a record delivered (and failed or abandoned) this often goes to the dead-letter stream.
    block_ms: how long take() waits for new entries when there are none.
    max_in_flight: backpressure; this consumer never holds more un-acked deliveries than this.
    reconnect_timeout_s: how long an operation keeps retrying while Redis is unreachable.
    """

    def __init__(self, client: redis.Redis, stream: str, group: str, consumer: str, *,
                 visibility_timeout_s: float = 30.0, max_deliveries: int = 3, block_ms: int = 200,
                 max_in_flight: int = 1024, reconnect_timeout_s: float = 60.0, dead_letter_maxlen: int = 10_000,
                 dead_letter_max_bytes: int = DEAD_LETTER_MAX_BYTES, full_timeout_s: float = FULL_TIMEOUT_S):
        if visibility_timeout_s <= 0 or max_deliveries < 1 or block_ms < 1 or max_in_flight < 1:
            raise ValueError(f"WorkQueue {stream!r}: visibility_timeout_s ({visibility_timeout_s}), max_deliveries "
                             f"({max_deliveries}), block_ms ({block_ms}) and max_in_flight ({max_in_flight}) must be positive")
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        if socket_timeout is not None and block_ms / 1000 >= socket_timeout:
            raise ValueError(f"WorkQueue {stream!r}: block_ms ({block_ms}) must be below the client's "
                             f"socket_timeout ({socket_timeout} s)")
        keep_freed_heap()  # entries of hundreds of KB: reuse freed heap rather than fault in fresh pages
        self.client, self.stream, self.group, self.consumer = client, stream, group, consumer
        self.visibility_ms = int(visibility_timeout_s * 1000)
        self.max_deliveries, self.block_ms, self.max_in_flight = max_deliveries, block_ms, max_in_flight
        self.reconnect_timeout_s, self.dead_letter_maxlen = reconnect_timeout_s, dead_letter_maxlen
        self.dead_letter_max_bytes, self.full_timeout_s = dead_letter_max_bytes, full_timeout_s
        self.full_waits = 0  # writes that found Redis full (maxmemory reached) and waited for memory
        self.full_seconds = 0.0  # time spent in those waits
        self.dead_stream = f"{stream}:dead"
        self.counted = CountedStream(client, stream, group)  # every write below goes through it, counted
        self._held: set[str] = set()  # ids delivered to this consumer and not yet acked / failed
        self._claim_cursor = "0-0"  # XAUTOCLAIM resumes its scan of the pending list here
        self._next_reclaim = 0.0  # monotonic time of the next reclaim scan
        self._retry("XGROUP CREATE", self._ensure_group)

    # -- producing ------------------------------------------------------------------------------------

    def put(self, entries: Iterable[Entry]) -> list[str]:
        """Append one entry per item, a record or a list of records; returns the entry ids. Each chunk of
        PUT_CHUNK XADDs is one MULTI/EXEC with their count, so a consumer blocked in take() wakes to the whole
        chunk, not to its first entry (a step's requests are served as one batch). A retry after a lost reply
        may add an entry twice (counted twice), which the idempotency key makes harmless."""
        payloads = [encode_entry(entry) for entry in entries]
        ids: list[str] = []
        for start in range(0, len(payloads), PUT_CHUNK):
            chunk = payloads[start:start + PUT_CHUNK]
            ids += self._retry("XADD", lambda: self._xadd_all(self.client.pipeline(transaction=True), chunk))
        return ids

    def _xadd_all(self, pipe, payloads: Sequence[bytes]) -> list[str]:
        if not payloads:
            return []
        self.counted.add(pipe, payloads)
        return [entry_id.decode() for entry_id in pipe.execute()[1:]]

    # -- consuming ------------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Deliveries this consumer holds un-acked."""
        return len(self._held)

    def take(self, max_count: int | None = None, block_ms: int | None = None) -> list[Delivery]:
        """Up to max_count deliveries (entries; never more than max_in_flight held at once): stale entries of
        dead consumers first, then new ones, waiting up to block_ms (the queue's by default; 0: no wait)
        when there are none. May return []."""
        room = self.max_in_flight - len(self._held)
        if max_count is not None:
            room = min(room, max_count)
        if room <= 0:
            return []
        taken = self._reclaim(room) if time.monotonic() >= self._next_reclaim else []
        if len(taken) < room:
            wait = None if taken else (self.block_ms if block_ms is None else block_ms)
            reply = self._retry("XREADGROUP", lambda: self.client.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=room - len(taken), block=wait or None))
            entries = reply[0][1] if reply else []
            taken += self._accept([(entry_id, fields, 1) for entry_id, fields in entries])
        return taken

    def _reclaim(self, count: int) -> list[Delivery]:
        """XAUTOCLAIM entries idle past the visibility timeout; dead-letter those delivered too often."""
        self._next_reclaim = time.monotonic() + min(1.0, self.visibility_ms / 4000)
        reply = self._retry("XAUTOCLAIM", lambda: self.client.xautoclaim(
            self.stream, self.group, self.consumer, self.visibility_ms, start_id=self._claim_cursor, count=count))
        self._claim_cursor = reply[0].decode()
        entries = [(entry_id, fields) for entry_id, fields in reply[1] if entry_id is not None]
        if not entries:
            return []
        ids = sorted((entry_id for entry_id, _ in entries), key=lambda entry_id: id_key(entry_id.decode()))
        pending = self._retry("XPENDING", lambda: self.client.xpending_range(
            self.stream, self.group, ids[0], ids[-1], len(ids) + len(self._held), consumername=self.consumer))
        counts = {item["message_id"]: item["times_delivered"] for item in pending}
        log.info("%s: reclaimed %d entries idle for over %d ms", self.stream, len(entries), self.visibility_ms)
        # An entry missing from our pending list was acknowledged by its old owner in the meantime.
        return self._accept([(entry_id, fields, counts[entry_id]) for entry_id, fields in entries
                             if entry_id in counts])

    def _accept(self, entries: list[tuple[bytes, dict, int]]) -> list[Delivery]:
        """Decode entries into deliveries; undecodable or over-delivered entries go to the dead letters."""
        deliveries = []
        for raw_id, fields, count in entries:
            entry_id = raw_id.decode()
            # An entry of our own held past the visibility timeout was lost by its caller (an error between
            # take and ack): it is delivered again like any reclaimed entry, so a held id never blocks for good.
            self._held.discard(entry_id)
            payload = fields.get(PAYLOAD_FIELD, b"")
            if count > self.max_deliveries:
                self._dead_letter(entry_id, payload, count, f"abandoned: delivered {count - 1} times without "
                                                            f"an ack (its consumer died or stalled each time)")
                continue
            try:
                records = decode_entry(payload)
            except PayloadError as exc:  # a result's bad numbers name its record: the letter keeps the key
                self._dead_letter(entry_id, payload, count, f"undecodable: {exc}", getattr(exc, "key", None))
                continue
            self._held.add(entry_id)
            deliveries.append(Delivery(entry_id, records, count, payload))
        return deliveries

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acknowledge deliveries whose downstream effect is already written (counted)."""
        if deliveries:
            ids = [delivery.id for delivery in deliveries]
            self._retry("XACK", lambda: self.counted.ack(ids))
            self._held.difference_update(ids)

    def forward(self, deliveries: Sequence[Delivery], downstream: "WorkQueue", entries: Iterable[Entry]) -> None:
        """Put entries (records or groups) on `downstream` and ack deliveries in one Lua script, counted: both
        happen or neither."""
        self._put_and_ack(downstream.stream, [encode_entry(entry) for entry in entries],
                          [delivery.id for delivery in deliveries], "forward")

    def _put_and_ack(self, stream: str, payloads: list[bytes], ids: list[str], what: str) -> None:
        if payloads or ids:
            self._retry(what, lambda: self.counted.forward(stream, payloads, ids))
        self._held.difference_update(ids)

    def release(self, deliveries: Sequence[Delivery], count_delivery: bool = True) -> None:
        """Hand deliveries back without a verdict: any consumer's next take() may reclaim them at once. With
        count_delivery=False this delivery does not count toward max_deliveries (the consumer could not serve it,
        through no fault of the entry's: weights behind the request's)."""
        by_count: dict[int | None, list[str]] = {}
        for delivery in deliveries:  # JUSTID keeps the delivery count, RETRYCOUNT sets it; IDLE: stale now
            by_count.setdefault(None if count_delivery else delivery.deliveries - 1, []).append(delivery.id)
        for count, ids in by_count.items():
            self._retry("XCLAIM", lambda ids=ids, count=count: self.client.xclaim(
                self.stream, self.group, self.consumer, 0, ids, idle=self.visibility_ms, retrycount=count,
                justid=True))
            self._held.difference_update(ids)

    def release_held(self) -> int:
        """Hand back every delivery held (processing failed between take and ack/forward): any consumer's next
        take() may reclaim them at once, with their delivery counts kept. When Redis does not answer they are
        only forgotten here, and come back after the visibility timeout. Returns how many were held."""
        ids = sorted(self._held, key=id_key)
        self._held.clear()
        if ids:
            try:
                self.client.xclaim(self.stream, self.group, self.consumer, 0, ids, idle=self.visibility_ms,
                                   justid=True)
            except redis.RedisError as exc:
                log.warning("%s: could not hand back %d entries (%s); they are reclaimed after the visibility "
                            "timeout", self.stream, len(ids), exc)
        return len(ids)

    def fail(self, delivery: Delivery, error: BaseException | str) -> bool:
        """Processing failed: retry the entry, or dead-letter it after max_deliveries; a group is split
        into single-record entries (written with the group's ack) that are retried one by one.
        True if dead-lettered (False too when it was acknowledged meanwhile: nothing to dead-letter)."""
        if len(delivery.records) > 1:
            log.warning("%s: group entry %s of %d records failed (%r); splitting it", self.stream, delivery.id,
                        len(delivery.records), error)
            self._put_and_ack(self.stream, [encode_entry(record) for record in delivery.records], [delivery.id],
                              "split")
            return False
        if delivery.deliveries >= self.max_deliveries:
            return self._dead_letter(delivery.id, delivery.payload, delivery.deliveries,
                                     f"failed {delivery.deliveries} times; last error: {error!r}")
        log.warning("%s: entry %s failed (delivery %d of %d): %r", self.stream, delivery.id,
                    delivery.deliveries, self.max_deliveries, error)
        self.release([delivery])
        return False

    def _dead_letter(self, entry_id: str, payload: bytes, deliveries: int, reason: str,
                     key: RecordKey | None = None) -> bool:
        """Move one entry to the dead-letter stream with its error (and the key of the record it names, when known),
        ack it and count it, atomically; nothing when it is no longer pending (another consumer acknowledged it
        meanwhile: it was processed after all). True when dead-lettered."""
        letter = {b"payload": payload, b"error": reason[:4000], b"entry_id": entry_id, b"deliveries": deliveries,
                  b"consumer": self.consumer}
        if key is not None:
            letter[b"key"] = json.dumps(list(key))
        moved = self._retry("dead-letter", lambda: self.counted.dead_letter(self.dead_stream, entry_id, letter,
                                                                            self.dead_letter_maxlen))
        self._held.discard(entry_id)
        if not moved:
            log.warning("%s: entry %s was acknowledged meanwhile; not dead-lettered (%s)", self.stream, entry_id,
                        reason)
            return False
        log.error("%s: entry %s dead-lettered to %s: %s", self.stream, entry_id, self.dead_stream, reason)
        self._cap_dead_letters()
        return True

    def _cap_dead_letters(self) -> None:
        """Dead letters hold whole payloads (~250 KB for a group of samples): a count cap alone does not bound
        their memory, so the stream is also trimmed, oldest first, to about dead_letter_max_bytes."""
        self._retry("dead-letter cap", lambda: cap_stream_bytes(self.client, self.dead_stream,
                                                                self.dead_letter_max_bytes))

    # -- resilience -----------------------------------------------------------------------------------

    def _ensure_group(self) -> None:
        """Create the group (and the stream) if missing; "0" so records put before it are delivered."""
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _retry(self, what: str, operation: Callable[[], T]) -> T:
        """Run operation, retrying with exponential backoff while Redis is unreachable or restarting, or full."""
        delay, deadline, full = 0.05, None, None
        while True:
            try:
                result = operation()
                if full is not None:
                    self.full_seconds += full.done()
                return result
            except redis.OutOfMemoryError as exc:  # maxmemory reached: backpressure, not a failure
                if full is None:
                    full = MemoryWait(f"{what} on {self.stream}", self.full_timeout_s)
                    self.full_waits += 1
                if not full.pause(exc, keep_alive=self._keep_held):
                    self.full_seconds += full.seconds
                    raise RedisFull(f"{what} on stream {self.stream!r}: Redis full (maxmemory reached) for "
                                    f"{self.full_timeout_s:g} s: {exc}") from exc
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # includes BusyLoadingError (AOF replay)
                now = time.monotonic()
                deadline = deadline or now + self.reconnect_timeout_s
                if now >= deadline:
                    raise QueueUnavailable(f"{what} on stream {self.stream!r}: Redis unreachable for "
                                           f"{self.reconnect_timeout_s:g} s: {exc}") from exc
                log.warning("%s on %s failed (%s); retrying in %.2f s", what, self.stream, exc, delay)
                time.sleep(delay)
                delay = min(2 * delay, 2.0)
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("%s: stream or group %r vanished; recreating it", self.stream, self.group)
                self._ensure_group()

    def _keep_held(self) -> None:
        """Reset the idle time of the entries this consumer holds (XCLAIM JUSTID, allowed while Redis is full),
        so no other consumer reclaims them while a write of ours waits for memory."""
        if self._held:
            self.client.xclaim(self.stream, self.group, self.consumer, 0, sorted(self._held, key=id_key),
                               justid=True)
