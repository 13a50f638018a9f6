"""The driver's care of its Redis (`services/redis_server.py`): the embedded server started again in place when it
exits, from the driver's loop and from a thread of its own (`EmbeddedRedisKeeper`), the driver's probe of whichever
Redis it has (`RedisProbe`), both recording what they see in the run's events (services/run_events.py), and the
driver's own writes waiting while Redis is full, as the workers' do (`wait_while_full`)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TypeVar

import redis

from pcl.config import RedisConfig
from services.redis_server import RedisHandle, RedisUnavailable
from services.run_events import RunEvents

FULL_WAIT_S = RedisConfig().full_timeout_s  # a full Redis: how long the driver's writes wait (redis.full_timeout_s)
T = TypeVar("T")


def wait_while_full(write: Callable[[], T], what: str, timeout_s: float = FULL_WAIT_S, poll_s: float = 0.25) -> T:
    """write(), tried again while Redis refuses it for its maxmemory (the run's trimming, or an operator, frees
    memory; the workers wait the same way: services.streams.queues), said once on stderr; after timeout_s, the
    OutOfMemoryError. `write` must be safe to repeat (a refused transaction writes nothing)."""
    deadline, said = time.monotonic() + timeout_s, False
    while True:
        try:
            return write()
        except redis.OutOfMemoryError:
            if time.monotonic() >= deadline:
                raise
            if not said:
                print(f"pcl: {what}: Redis is full (maxmemory reached); waiting for memory, for up to "
                      f"{timeout_s:.0f} s", file=sys.stderr, flush=True)
                said = True
            time.sleep(poll_s)


class EmbeddedRedisKeeper:
    """The driver's watch on its embedded Redis: started again in place when it exits (a full disk makes Redis
    exit on its AOF write error; an OOM kill), at most `limit` times; clients reconnect within their backoff.
    Called every second while the run goes, and before each start of the fleet; with watch(), also from a thread
    of its own, so that a Redis lost while the driver is busy elsewhere (starting Ray or the fleet, restarting it)
    is back within a second, not at the driver's next poll.

    keep = EmbeddedRedisKeeper(handle, limit, events, probe).watch()   # ... keep() in the driver's loop ...
    keep.stop()

    With `events`, each restart is recorded as a `redis_restart` window, from the last moment the server was seen
    running to its start again; with a `probe`, the watching thread (then started for an external Redis too) also
    probes the server after each check.
    """

    def __init__(self, handle: RedisHandle, limit: int, events: RunEvents | None = None,
                 probe: "RedisProbe | None" = None):
        self.handle, self.limit, self.restarts = handle, limit, 0
        self.events, self.probe = events, probe
        self.seen_running = time.time()  # the last check that found the server running
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._quiet = threading.Event()  # no more probes: the driver is closing its Redis
        self._thread: threading.Thread | None = None
        self.error: RedisUnavailable | None = None  # the watcher's: raised at the driver's next call

    def watch(self, interval_s: float = 1.0) -> "EmbeddedRedisKeeper":
        """Check every interval_s from a daemon thread until stop(). A server that thread starts is stopped when
        the thread ends (by the thread itself, and by Linux's parent-death signal, which also covers the process
        being killed: services.redis_server): call stop() after the handle is closed."""
        if (self.handle.embedded or self.probe is not None) and self._thread is None:
            self._thread = threading.Thread(target=self._watch, args=(interval_s,), name="pcl-redis-keeper",
                                            daemon=True)
            self._thread.start()
        return self

    def _watch(self, interval_s: float) -> None:
        started = None  # the server process this thread started, which ends with it
        try:
            while not self._stopped.wait(interval_s) and self.error is None:
                try:
                    if self._keep(die_with_thread=True):  # this thread lasts as long as the run: the server with it
                        started = self.handle.process
                except RedisUnavailable as exc:
                    self.error = exc
                if self.probe is not None and not self._quiet.is_set():
                    self.probe()
        finally:
            if self.probe is not None:
                self.probe.close()
            with self._lock:
                if started is not None and self.handle.process is started:
                    self.handle.stop()

    def quiet(self) -> None:
        """Probe no more (call before closing the handle: a server stopped on purpose is no outage)."""
        self._quiet.set()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def __call__(self) -> None:
        if self.error is not None:
            raise self.error
        self._keep(die_with_thread=None)

    def _keep(self, die_with_thread: bool | None) -> bool:
        with self._lock:
            return self._revive(die_with_thread)

    def _revive(self, die_with_thread: bool | None) -> bool:
        """Start the server again if it has exited; returns whether it did."""
        why = self.handle.exit_reason() if self.handle.embedded else None
        if why is None:
            self.seen_running = time.time()
            return False
        if self.restarts >= self.limit:
            raise RedisUnavailable(f"the embedded Redis exited again ({why}) after {self.restarts} restarts "
                                   f"(checkpoint.max_restarts); on a full disk, free space under "
                                   f"{self.handle.data_dir}, then resume")
        self.restarts += 1
        print(f"pcl: the embedded Redis exited ({why}); restarting it (restart {self.restarts} of {self.limit})",
              file=sys.stderr, flush=True)
        self.handle.revive(die_with_thread)
        if self.events is not None:
            self.events.record("redis_restart", self.seen_running, time.time(), f"restart {self.restarts}: {why}")
        return True


class RedisProbe:
    """The driver's own look at its Redis, once a call (the keeper's thread calls it every second): a PING and a
    small write (`key`, overwritten, expiring). The windows in which it fails are recorded in the run's events:
    `redis_unreachable` (no answer, or still loading its data) and `redis_full` (writes refused for maxmemory),
    each from the last probe that went through to the first that goes through again."""

    def __init__(self, client: redis.Redis, key: str, events: RunEvents):
        self.client, self.key, self.events = client, key, events
        self.last_ok = time.time()
        self.open: tuple[str, str] | None = None  # (type, event key) of the window now open

    def __call__(self) -> str | None:
        """Probe once; the type of the window the failure opened or keeps open, None when Redis answered."""
        now = time.time()
        try:
            self.client.ping()
            self.client.set(self.key, str(now), ex=3600)
            failed, why = None, ""
        except redis.OutOfMemoryError as exc:
            failed, why = "redis_full", str(exc)
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # BusyLoadingError too: loading its AOF
            failed, why = "redis_unreachable", f"{type(exc).__name__}: {exc}"
        if failed is None:
            self.close(now)
            self.last_ok = now
        elif self.open is None or self.open[0] != failed:
            self.close(now)
            self.open = (failed, self.events.begin(failed, why[:200], start=self.last_ok))
        return failed

    def close(self, end: float | None = None) -> None:
        """Close the window now open, if any."""
        if self.open is not None:
            self.events.end(self.open[1], end)
            self.open = None
