"""The control plane while its Redis is unreachable (restarting, loading its AOF, the network away for a while):
reads answer from their last good reading, marked stale; a mutation waits a few seconds for Redis to come back
before it is refused.

    readings = Readings()
    status, stale = readings.read("status", store.status)    # stale: None, or {"reason", "age_s", "as_of"}
    event = write_retrying(store.request_pause, WRITE_RETRY_S)  # the Redis error once WRITE_RETRY_S have passed

A read with no good reading yet raises the Redis error (the API answers 503 with Retry-After). A mutation is
either recorded durably in Redis (the answer says so) or refused with 503: never half-done (each request is
one Redis transaction: services/control/requests.py).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable, TypeVar

import redis

# Redis not answering: refused connections, timeouts, and a server still loading its data (BusyLoadingError is a
# ConnectionError). Not a command Redis refuses (a bad stream id), which is the request's fault.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)
# A write also waits while Redis is full (its maxmemory reached: writers elsewhere free it, or an operator does).
TRANSIENT_WRITE = (*UNREACHABLE, redis.OutOfMemoryError)
WRITE_RETRY_S = 5.0  # how long a mutation waits for Redis before its 503 (the embedded Redis is back within ~2 s)
RETRY_AFTER_S = 2  # the Retry-After of a 503 for Redis unreachable
KEPT_READINGS = 16  # distinct reads (route and query) whose last good answer is kept, the least recent dropped

T = TypeVar("T")


class Readings:
    """The last good answer of each read, to serve, marked stale, while Redis is unreachable. Thread-safe (the
    routes run in a thread pool)."""

    def __init__(self, kept: int = KEPT_READINGS):
        self.kept = kept
        self._last: OrderedDict[Hashable, tuple[float, float, Any]] = OrderedDict()  # key -> (time, monotonic, value)
        self._lock = threading.Lock()

    def read(self, key: Hashable, fetch: Callable[[], T]) -> tuple[T, dict | None]:
        """(fetch(), None) when Redis answers; else the last good answer under `key` with what makes it stale:
        {"reason", "age_s" (seconds since it was read), "as_of" (Unix time it was read)}. With none kept, the
        Redis error."""
        try:
            value = fetch()
        except UNREACHABLE as exc:
            with self._lock:
                kept = self._last.get(key)
            if kept is None:
                raise
            as_of, taken, value = kept
            return value, {"reason": f"Redis unreachable ({type(exc).__name__}): the last good reading",
                           "age_s": round(time.monotonic() - taken, 2), "as_of": as_of}
        with self._lock:
            self._last[key] = (time.time(), time.monotonic(), value)
            self._last.move_to_end(key)
            while len(self._last) > self.kept:
                self._last.popitem(last=False)
        return value, None


def write_retrying(write: Callable[[], T], within_s: float = WRITE_RETRY_S) -> T:
    """write(), tried again while Redis is unreachable or full, for at most `within_s` seconds (backoff 0.1 s
    doubling to 1 s); then its Redis error."""
    deadline = time.monotonic() + within_s
    pause = 0.1
    while True:
        try:
            return write()
        except TRANSIENT_WRITE:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(pause, left))
            pause = min(2 * pause, 1.0)


def stale_header(stale: dict | None) -> dict[str, str]:
    """The response header of a stale answer (`PCL-Stale: age_s=3.1; reason="..."`), {} for a fresh one."""
    if stale is None:
        return {}
    return {"PCL-Stale": f"age_s={stale['age_s']:g}; reason=\"{stale['reason']}\""}
