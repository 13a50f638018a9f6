"""The control plane while its Redis is unreachable (restarting, loading its AOF, the network away for a while):
reads answer from their last good reading, marked stale; a mutation, or a read with no reading yet, waits a few
seconds for Redis to come back before it is refused.

    readings = Readings(wait_s=REDIS_WAIT_S)
    status, stale = readings.read("status", store.status)    # stale: None, or {"reason", "age_s", "as_of"}
    event = retrying(store.request_pause, REDIS_WAIT_S)       # the Redis error once REDIS_WAIT_S have passed

The API answers 503 with Retry-After when the wait runs out. A mutation is either recorded durably in Redis (the
answer says so) or refused with 503: never half-done (each request is one Redis transaction:
services/control/requests.py).
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
# How long a request waits for Redis before its 503: a mutation, or a read with no last good reading (the driver
# starts its embedded Redis again within about a second: services/redis_keeper.py).
REDIS_WAIT_S = 5.0
RETRY_AFTER_S = 2  # the Retry-After of a 503 for Redis unreachable
KEPT_READINGS = 16  # distinct reads (route and query) whose last good answer is kept, the least recent dropped

T = TypeVar("T")


class Readings:
    """The last good answer of each read, to serve, marked stale, while Redis is unreachable. Thread-safe (the
    routes run in a thread pool)."""

    def __init__(self, kept: int = KEPT_READINGS, wait_s: float = REDIS_WAIT_S):
        self.kept, self.wait_s = kept, wait_s
        self._last: OrderedDict[Hashable, tuple[float, float, Any]] = OrderedDict()  # key -> (time, monotonic, value)
        self._lock = threading.Lock()

    def read(self, key: Hashable, fetch: Callable[[], T], wait_s: float | None = None) -> tuple[T, dict | None]:
        """(fetch(), None) when Redis answers; else the last good answer under `key` with what makes it stale:
        {"reason", "age_s" (seconds since it was read), "as_of" (Unix time it was read)}. With none kept, fetch()
        is tried again for up to `wait_s` (default: the instance's), then its Redis error."""
        try:
            value = fetch()
        except UNREACHABLE as exc:
            with self._lock:
                kept = self._last.get(key)
            if kept is None:
                value = retrying(fetch, self.wait_s if wait_s is None else wait_s, UNREACHABLE)
            else:
                as_of, taken, value = kept
                return value, {"reason": f"Redis unreachable ({type(exc).__name__}): the last good reading",
                               "age_s": round(time.monotonic() - taken, 2), "as_of": as_of}
        with self._lock:
            self._last[key] = (time.time(), time.monotonic(), value)
            self._last.move_to_end(key)
            while len(self._last) > self.kept:
                self._last.popitem(last=False)
        return value, None


def retrying(call: Callable[[], T], within_s: float = REDIS_WAIT_S,
             transient: tuple[type[Exception], ...] = TRANSIENT_WRITE) -> T:
    """call(), tried again while it raises one of `transient` (Redis unreachable or, for a write, full), for at
    most `within_s` seconds (backoff 0.1 s doubling to 1 s); then that error."""
    deadline = time.monotonic() + within_s
    pause = 0.1
    while True:
        try:
            return call()
        except transient:
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
