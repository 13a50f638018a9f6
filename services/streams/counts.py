"""What happened to every entry of a work stream, counted by the run in Redis beside the stream, each count written in
the same atomic step as what it counts (one Lua script or one MULTI/EXEC), so that no crash, retry or restart
separates an operation from its count.

    {stream}:counts   hash   put             entries the run added (put, forward, a failed group split)
                             injected        entries added from outside the run (a chaos run's malformed entries)
                             acked           entries a consumer acknowledged (XACK's own count: an entry two
                                             consumers acknowledge counts once)
                             dead            entries dead-lettered (only while still un-acknowledged)
                             trimmed         entries a commit's trim removed (`trim_committed`)
                             trimmed_unacked of those, never acknowledged (pending, or never delivered)
                             purged          entries a restart's purge removed (`purge`)
                             purged_unacked  of those, never acknowledged

Redis alone cannot say at a run's end what became of its entries: a commit trims them, a restart deletes the
streams. These counts can: with what Redis holds of the stream at a quiet moment (`stream_state`) they balance,
as `pcl.tools.chaos_checks.stream_balance` checks:

    put + injected = trimmed + purged + length                                      (every entry is still there
                                                                                     or was removed, counted)
    put + injected = acked + dead + trimmed_unacked + purged_unacked + pending + unread
                                                                                    (every entry was acknowledged
                                                                                     once, dead-lettered, dropped
                                                                                     unacknowledged, or is held)

The counts are never reset (a run's counts add up across its restarts and resumes, in its Redis); a Redis that
loses its data loses them with the streams, which is why a chaos run requires the append-only file. Dropped
unacknowledged entries are expected (a duplicate or an entry of a finished step at a commit, work in flight at a
restart); the counts say how many, not which: that every step got its samples is the step records' to show.

The scripts use `redis.pcall` for their first write and answer a refusal with its own error, so that a full
Redis (maxmemory) still raises redis.OutOfMemoryError and nothing is written (Redis 6.2 and 7).
"""

from __future__ import annotations

from typing import Sequence

import redis

PAYLOAD_FIELD = b"d"  # the one field of every stream entry: the encoded record or record group
COUNTS = ("put", "injected", "acked", "dead", "trimmed", "trimmed_unacked", "purged", "purged_unacked")
RANGE_CHUNK = 64  # entries per XRANGE when a script counts entries that were never delivered


def counts_key(stream: str) -> str:
    """The counts hash of stream key `stream`."""
    return f"{stream}:counts"


# Shared by the scripts: a refusal passed on as its own error (Redis 6.2 prefixes pcall errors with the script's
# position: "@user_script: 2: -OOM ..."), stream ids compared as numbers (decimal strings up to 20 digits, beyond
# Lua's doubles), and the entries of a range counted a chunk at a time.
_LUA_HELPERS = f"""
local function refused(r)
  local at = string.find(r.err, 'OOM', 1, true)
  return redis.error_reply(at and string.sub(r.err, at) or r.err)
end
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function before(a, b)
  local am, as = string.match(a, '(%d+)-(%d+)')
  local bm, bs = string.match(b, '(%d+)-(%d+)')
  if am ~= bm then return less(am, bm) end
  return less(as, bs)
end
local function count_range(key, from, to)
  local n = 0
  while true do
    local batch = redis.call('XRANGE', key, from, to, 'COUNT', {RANGE_CHUNK})
    n = n + #batch
    if #batch < {RANGE_CHUNK} then return n end
    from = '(' .. batch[#batch][1]
  end
end
local function ack_all(key, group, from)
  local acked = 0
  for i = from, #ARGV, 1000 do
    acked = acked + redis.call('XACK', key, group, unpack(ARGV, i, math.min(i + 999, #ARGV)))
  end
  return acked
end
local function fields(flat)
  local out = {{}}
  for i = 1, #flat, 2 do out[flat[i]] = flat[i + 1] end
  return out
end
"""

# KEYS: downstream stream, its counts, this stream, its counts. ARGV: this stream's group, the number n of entries,
# the n payloads, then the ids to acknowledge. Returns the new entries' ids.
FORWARD = _LUA_HELPERS + """
local n = tonumber(ARGV[2])
local ids = {}
for i = 1, n do
  local id = redis.pcall('XADD', KEYS[1], '*', '@FIELD@', ARGV[2 + i])
  if type(id) == 'table' and id.err then return refused(id) end
  ids[i] = id
end
if n > 0 then redis.call('HINCRBY', KEYS[2], 'put', n) end
local acked = ack_all(KEYS[3], ARGV[1], 3 + n)
if acked > 0 then redis.call('HINCRBY', KEYS[4], 'acked', acked) end
return ids
""".replace("@FIELD@", PAYLOAD_FIELD.decode())

# KEYS: stream, counts. ARGV: group, ids. Returns how many were acknowledged (not before, by anyone).
ACK = _LUA_HELPERS + """
local acked = ack_all(KEYS[1], ARGV[1], 2)
if acked > 0 then redis.call('HINCRBY', KEYS[2], 'acked', acked) end
return acked
"""

# KEYS: stream, counts, dead-letter stream. ARGV: group, entry id, the dead-letter stream's maxlen, then the
# letter's field / value pairs. Returns 1 when dead-lettered, 0 when the entry was no longer pending (another
# consumer acknowledged it meanwhile, or a trim removed it): then there is nothing to dead-letter.
DEAD_LETTER = _LUA_HELPERS + """
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then return 0 end
local r = redis.pcall('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', unpack(ARGV, 4))
if type(r) == 'table' and r.err then return refused(r) end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], 'dead', 1)
return 1
"""

# KEYS: stream, counts. ARGV: the counted group, the first id kept, the id just before it. Every group's pending
# entries below the first id kept are acknowledged, the entries removed (XTRIM MINID), and a group that had not
# read that far is moved past them (with Redis 7's entries-read, so its lag stays exact; refused while Redis is full,
# it is done at the next trim). Returns the entries removed.
TRIM = _LUA_HELPERS + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local unacked, behind = 0, {}
for _, flat in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local g = fields(flat)
  while true do
    local stale = redis.call('XPENDING', KEYS[1], g['name'], '-', ARGV[3], 1000)
    if #stale == 0 then break end
    local ids = {}
    for i, item in ipairs(stale) do ids[i] = item[1] end
    local acked = redis.call('XACK', KEYS[1], g['name'], unpack(ids))
    if g['name'] == ARGV[1] then unacked = unacked + acked end
  end
  if before(g['last-delivered-id'], ARGV[3]) then
    if g['name'] == ARGV[1] then unacked = unacked + count_range(KEYS[1], '(' .. g['last-delivered-id'], ARGV[3]) end
    behind[#behind + 1] = g['name']
  end
end
local removed = redis.call('XTRIM', KEYS[1], 'MINID', ARGV[2])
if #behind > 0 then
  local info = fields(redis.call('XINFO', 'STREAM', KEYS[1]))
  for _, name in ipairs(behind) do
    if info['entries-added'] then
      redis.pcall('XGROUP', 'SETID', KEYS[1], name, ARGV[3], 'ENTRIESREAD', info['entries-added'] - info['length'])
    else
      redis.pcall('XGROUP', 'SETID', KEYS[1], name, ARGV[3])
    end
  end
end
if removed > 0 then redis.call('HINCRBY', KEYS[2], 'trimmed', removed) end
if unacked > 0 then redis.call('HINCRBY', KEYS[2], 'trimmed_unacked', unacked) end
return removed
"""

# KEYS: stream, counts. ARGV: the counted group. Deletes the stream with its groups; returns the entries removed.
PURGE = _LUA_HELPERS + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local length = redis.call('XLEN', KEYS[1])
local unacked = length
for _, flat in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local g = fields(flat)
  if g['name'] == ARGV[1] then
    unacked = g['pending'] + count_range(KEYS[1], '(' .. g['last-delivered-id'], '+')
  end
end
redis.call('DEL', KEYS[1])
if length > 0 then redis.call('HINCRBY', KEYS[2], 'purged', length) end
if unacked > 0 then redis.call('HINCRBY', KEYS[2], 'purged_unacked', unacked) end
return length
"""

# KEYS: stream, counts. ARGV: the payload. An entry added from outside the run, counted as injected.
INJECT = _LUA_HELPERS + """
local id = redis.pcall('XADD', KEYS[1], '*', '@FIELD@', ARGV[1])
if type(id) == 'table' and id.err then return refused(id) end
redis.call('HINCRBY', KEYS[2], 'injected', 1)
return id
""".replace("@FIELD@", PAYLOAD_FIELD.decode())


class CountedStream:
    """The counted operations on one stream of one group, through `client` (scripts are sent once per server,
    then called by their SHA; a restarted server gets them again)."""

    def __init__(self, client: redis.Redis, stream: str, group: str):
        self.client, self.stream, self.group, self.counts = client, stream, group, counts_key(stream)
        self._forward, self._ack = client.register_script(FORWARD), client.register_script(ACK)
        self._dead, self._trim = client.register_script(DEAD_LETTER), client.register_script(TRIM)
        self._purge = client.register_script(PURGE)

    def add(self, pipe, payloads: Sequence[bytes]) -> None:
        """Queue the XADDs of `payloads` and their count on `pipe` (a MULTI pipeline): its replies are the count,
        then one id per payload."""
        pipe.hincrby(self.counts, "put", len(payloads))
        for payload in payloads:
            pipe.xadd(self.stream, {PAYLOAD_FIELD: payload})

    def forward(self, downstream: str, payloads: Sequence[bytes], ids: Sequence[str]) -> list[str]:
        """Add `payloads` to `downstream` and acknowledge `ids` here, both counted, atomically; the new ids."""
        new = self._forward(keys=[downstream, counts_key(downstream), self.stream, self.counts],
                            args=[self.group, len(payloads), *payloads, *ids])
        return [entry_id.decode() if isinstance(entry_id, bytes) else entry_id for entry_id in new]

    def ack(self, ids: Sequence[str]) -> int:
        return int(self._ack(keys=[self.stream, self.counts], args=[self.group, *ids])) if ids else 0

    def dead_letter(self, dead_stream: str, entry_id: str, letter: dict, maxlen: int) -> bool:
        """Move a pending entry to `dead_stream` as `letter`, acknowledge and count it; False (nothing written)
        when the entry is no longer pending."""
        flat = [part for key_value in letter.items() for part in key_value]
        return bool(self._dead(keys=[self.stream, self.counts, dead_stream],
                               args=[self.group, entry_id, maxlen, *flat]))

    def trim(self, min_id: str, last_trimmed: str) -> int:
        return int(self._trim(keys=[self.stream, self.counts], args=[self.group, min_id, last_trimmed]))

    def purge(self) -> int:
        return int(self._purge(keys=[self.stream, self.counts], args=[self.group]))


def inject(client: redis.Redis, stream: str, payload: bytes) -> str:
    """Add one entry from outside the run (a chaos run's malformed entry), counted as injected."""
    entry_id = client.register_script(INJECT)(keys=[stream, counts_key(stream)], args=[payload])
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


def read_counts(client: redis.Redis, stream: str) -> dict[str, int]:
    """The counts of stream key `stream`, every one of COUNTS (0 where never counted)."""
    raw = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in client.hgetall(counts_key(stream)).items()}
    return {name: raw.get(name, 0) for name in COUNTS}


def stream_state(client: redis.Redis, stream: str, group: str) -> dict:
    """What Redis holds of one stream now, with its counts: {"exists", "group" (the group exists), "length",
    "pending" (the group's un-acknowledged deliveries), "unread" (entries never delivered to the group),
    "counts"}."""
    state = {"exists": bool(client.exists(stream)), "group": False, "length": 0, "pending": 0, "unread": 0,
             "counts": read_counts(client, stream)}
    if not state["exists"]:
        return state
    state["length"] = int(client.xlen(stream))
    groups = {(g["name"].decode() if isinstance(g["name"], bytes) else g["name"]): g
              for g in client.xinfo_groups(stream)}
    if group in groups:
        info = groups[group]
        last = info["last-delivered-id"]
        last = last.decode() if isinstance(last, bytes) else last
        state.update(group=True, pending=int(info["pending"]), unread=_count_after(client, stream, last))
    return state


def _count_after(client: redis.Redis, stream: str, entry_id: str) -> int:
    count, cursor = 0, f"({entry_id}"
    while batch := client.xrange(stream, cursor, "+", count=1000):
        count += len(batch)
        cursor = "(" + (batch[-1][0].decode() if isinstance(batch[-1][0], bytes) else batch[-1][0])
    return count

