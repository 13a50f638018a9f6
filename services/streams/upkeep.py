"""What a work queue does besides delivering: read entries back by id, inspect a stream (depth, dead letters, its
newest entry) and trim it when a step commits. `services.streams.queues.WorkQueue` is a StreamUpkeep; the methods use its
client, stream, group, consumer's held ids and retrying `_retry`."""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import redis

from services.streams.counts import PAYLOAD_FIELD, CountedStream, read_counts
from services.streams.payloads import PayloadError, Record, RewardNote, RewardRecord, decode_entry

log = logging.getLogger(__name__)

FETCH_CHUNK = 64  # entries read back per pipeline round trip by fetch() (a group of 16 samples is ~250 KB)


def id_key(entry_id: str) -> tuple[int, int]:
    """An entry id as a sortable (milliseconds, sequence) pair."""
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _id_after(entry_id: str) -> str:
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"


def _id_before(entry_id: str) -> str:
    ms, seq = id_key(entry_id)
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-{2**64 - 1}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _letter(fields: dict[bytes, bytes]) -> dict[str, object]:
    return {key.decode(): (value if key == b"payload" else value.decode()) for key, value in fields.items()}


class StreamUpkeep:
    """Reading back, inspecting and trimming one stream (a base of WorkQueue, which sets the attributes)."""

    client: redis.Redis
    stream: str
    group: str
    visibility_ms: int
    dead_stream: str
    counted: CountedStream
    _held: set[str]
    _retry: Callable  # (what, operation): operation(), retried while Redis is unreachable, restarting or full

    # -- reading entries back -------------------------------------------------------------------------

    def fetch(self, refs: Sequence[tuple[str, int]]) -> list[Record | None]:
        """The records at (entry id, position in the entry's group), read back from this stream (pipelined
        XRANGEs, each entry read and decoded once); None where the entry is gone (trimmed), does not decode,
        or has no such position. Reading does not touch any consumer group."""
        entries = self.read_entries([entry_id for entry_id, _ in refs])
        out: list[Record | None] = []
        for entry_id, position in refs:
            records = entries[entry_id]
            out.append(records[position] if records is not None and 0 <= position < len(records) else None)
        return out

    def read_entries(self, entry_ids: Sequence[str]) -> dict[str, list[Record] | None]:
        """The records of each entry, by id (None where it is gone or does not decode), read as `fetch` reads."""
        ids = list(dict.fromkeys(entry_ids))
        entries: dict[str, list[Record] | None] = {}
        for start in range(0, len(ids), FETCH_CHUNK):
            chunk = ids[start:start + FETCH_CHUNK]

            def read() -> list:
                pipe = self.client.pipeline(transaction=False)
                for entry_id in chunk:
                    pipe.xrange(self.stream, entry_id, entry_id, count=1)
                return pipe.execute()

            for entry_id, reply in zip(chunk, self._retry("XRANGE", read)):
                try:
                    entries[entry_id] = decode_entry(reply[0][1][PAYLOAD_FIELD]) if reply else None
                except PayloadError as exc:
                    log.error("%s: entry %s does not decode: %s", self.stream, entry_id, exc)
                    entries[entry_id] = None
        return entries

    def join(self, notes: Sequence[RewardNote]) -> list[RewardRecord | None]:
        """Reward notes joined with the results they point at in this (the results) stream: one RewardRecord
        per note, None where the result is gone or is not the note's sample."""
        joined: list[RewardRecord | None] = []
        for note, result in zip(notes, self.fetch([(note.result_entry, note.position) for note in notes])):
            try:
                joined.append(None if result is None else RewardRecord.from_note(note, result))
            except PayloadError as exc:
                log.error("%s: %s", self.stream, exc)
                joined.append(None)
        return joined

    # -- inspecting and trimming ----------------------------------------------------------------------

    def dead_letter_count(self) -> int:
        """Entries of this stream dead-lettered so far (all consumers)."""
        return self.counts()["dead"]

    def counts(self) -> dict[str, int]:
        """What became of this stream's entries so far (services/streams/counts.py)."""
        return self._retry("HGETALL", lambda: read_counts(self.client, self.stream))

    def dead_letters(self, count: int = 100) -> list[dict[str, object]]:
        """The newest dead letters: entry_id, error, deliveries, consumer, the raw payload and, for a record refused
        for its numbers, key (the record's idempotency key as a JSON list)."""
        entries = self._retry("XREVRANGE", lambda: self.client.xrevrange(self.dead_stream, count=count))
        return [_letter(fields) for _, fields in entries]

    def dead_letters_after(self, letter_id: str, count: int = 100) -> list[tuple[str, dict[str, object]]]:
        """(letter id, letter) of the oldest `count` dead letters written after `letter_id` ("0-0": from the first),
        as `dead_letters` reads them."""
        entries = self._retry("XRANGE", lambda: self.client.xrange(self.dead_stream, f"({letter_id}", "+",
                                                                   count=count))
        return [(letter_id.decode(), _letter(fields)) for letter_id, fields in entries]

    def dead_tail_id(self) -> str:
        """Id of the newest dead letter, "0-0" when there is none."""
        newest = self._retry("XREVRANGE", lambda: self.client.xrevrange(self.dead_stream, count=1))
        return newest[0][0].decode() if newest else "0-0"

    def depth(self) -> int:
        """Entries of this group not yet acknowledged: pending plus not yet delivered."""
        group = self._group_info()
        if group is None:
            return 0
        lag = group.get("lag")
        if lag is None:  # Redis < 7 has no lag: count the undelivered entries by reading past the cursor
            lag, cursor = 0, "(" + group["last-delivered-id"].decode()
            while batch := self._retry("XRANGE", lambda: self.client.xrange(self.stream, cursor, "+", count=1000)):
                lag += len(batch)
                cursor = "(" + batch[-1][0].decode()
        return int(group["pending"]) + int(lag)

    def _group_info(self) -> dict | None:
        try:
            groups = self._retry("XINFO GROUPS", lambda: self.client.xinfo_groups(self.stream))
        except redis.ResponseError:  # the stream does not exist (yet)
            return None
        return next((g for g in groups if g["name"].decode() == self.group), None)

    def held(self, count: int = 10_000) -> list[tuple[str, str, int]]:
        """(entry id, consumer, ms since it was last delivered) of the entries the group's consumers hold
        unacknowledged (its pending entries, up to `count`), oldest first."""
        pending = self._retry("XPENDING", lambda: self.client.xpending_range(self.stream, self.group, "-", "+",
                                                                             count))
        return [(_text(p["message_id"]), _text(p["consumer"]), int(p["time_since_delivered"])) for p in pending]

    def tail_id(self) -> str:
        """Id of the newest entry, "0-0" when the stream is empty."""
        newest = self._retry("XREVRANGE", lambda: self.client.xrevrange(self.stream, count=1))
        return newest[0][0].decode() if newest else "0-0"

    def trim_before(self, min_id: str) -> int:
        """Delete entries with ids below min_id, and their pending entries in every group, in one counted step
        (services/streams/counts.py: groups that had not read that far are moved past them, so Redis 7's lag
        stays exact); returns how many entries were deleted. Consumers idle for long with nothing pending are
        forgotten too."""
        removed = self._retry("trim", lambda: self.counted.trim(min_id, _id_before(min_id)))
        if not removed and not self._retry("EXISTS", lambda: self.client.exists(self.stream)):
            return 0
        for group in self._retry("XINFO GROUPS", lambda: self.client.xinfo_groups(self.stream)):
            name = group["name"]
            for consumer in self._retry("XINFO CONSUMERS", lambda: self.client.xinfo_consumers(self.stream, name)):
                if consumer["pending"] == 0 and consumer["idle"] > max(60_000, 10 * self.visibility_ms):
                    try:
                        self.client.xgroup_delconsumer(self.stream, name, consumer["name"])
                    except redis.OutOfMemoryError:  # XGROUP is refused while Redis is full; next time
                        pass
        self._held = {entry_id for entry_id in self._held if id_key(entry_id) >= id_key(min_id)}
        return int(removed)

    def trim_committed(self) -> int:
        """Trim everything the stream holds now. Call when a step commits, before the next step's records
        are put: whatever is left then is a duplicate or a record of a finished step."""
        tail = self.tail_id()
        return self.trim_before(_id_after(tail)) if tail != "0-0" else 0
