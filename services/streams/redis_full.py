"""A full Redis (maxmemory reached, noeviction) as backpressure, for services.streams.queues.

A full Redis refuses writes (XADD, XGROUP CREATE, a MULTI holding one) with OutOfMemoryError, while reads, XACK,
XCLAIM, XAUTOCLAIM, XTRIM and DEL go through. A refused write waits for memory instead of failing:

    wait = None
    while True:
        try:
            write(); break
        except redis.OutOfMemoryError as exc:
            wait = wait or MemoryWait(f"XADD on {stream}", timeout_s=600.0)
            if not wait.pause(exc, keep_alive=claim_what_we_hold):
                raise RedisFull(...)                 # still full after timeout_s
    if wait: seconds = wait.done()                  # logs that memory came back

Dead-letter streams hold whole payloads (a group of samples is ~250 KB): `cap_stream_bytes` trims one, oldest
first, to about a byte budget.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import redis

log = logging.getLogger("services.streams.queues")
LOG_EVERY_S = 30.0  # while a write waits, one log line this often
FIRST_DELAY_S, MAX_DELAY_S = 0.05, 2.0  # waits between attempts: 0.05 s doubling to 2 s


class MemoryWait:
    """The wait of one write that Redis refused for want of memory: log it (a warning when it starts, one every
    LOG_EVERY_S, one when it ends), sleep with backoff between attempts, give up after timeout_s."""

    def __init__(self, what: str, timeout_s: float):
        self.what, self.timeout_s = what, timeout_s
        self.started = self.last_line = time.monotonic()
        self.delay = FIRST_DELAY_S
        self.logged = False

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def pause(self, exc: redis.OutOfMemoryError, keep_alive: Callable[[], None] | None = None) -> bool:
        """Wait before the next attempt; False (no wait) once the write has waited timeout_s. keep_alive runs
        first (the caller refreshes what it holds, so nobody reclaims it meanwhile)."""
        now = time.monotonic()
        if not self.logged:
            self.logged = True
            log.warning("%s: Redis is full (maxmemory reached: %s); this worker pauses until memory frees, for up "
                        "to %g s", self.what, exc, self.timeout_s)
        elif now - self.last_line >= LOG_EVERY_S:
            self.last_line = now
            log.warning("%s: Redis still full after %.0f s; waiting", self.what, now - self.started)
        if now - self.started >= self.timeout_s:
            return False
        if keep_alive is not None:
            try:
                keep_alive()
            except redis.RedisError:
                pass
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, MAX_DELAY_S)
        return True

    def done(self) -> float:
        """The write went through: log it; returns the seconds it waited."""
        waited = self.seconds
        log.warning("%s: Redis has memory again; the write went through after %.1f s", self.what, waited)
        return waited


def cap_stream_bytes(client: redis.Redis, stream: str, max_bytes: int) -> int:
    """Trim `stream`, oldest entries first, to about max_bytes of Redis memory (MEMORY USAGE, every node
    counted); returns how many entries were dropped."""
    used = client.memory_usage(stream, samples=0) or 0
    if used <= max_bytes:
        return 0
    length = client.xlen(stream)
    keep = max(1, int(length * max_bytes / used))
    client.xtrim(stream, maxlen=keep, approximate=False)
    log.warning("%s: over %d bytes (%d in %d entries): the oldest %d entries were dropped", stream, max_bytes,
                used, length, length - keep)
    return length - keep
