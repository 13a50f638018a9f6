"""The driver's care of its Redis (`services/redis_server.py`): the embedded server started again in place when it
exits, from the driver's loop and from a thread of its own (`EmbeddedRedisKeeper`), and the driver's own writes
waiting while Redis is full, as the workers' do (`wait_while_full`)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TypeVar

import redis

from services.redis_server import RedisHandle, RedisUnavailable

FULL_WAIT_S = 600.0  # how long the driver's writes wait for a full Redis (the workers': queues.FULL_TIMEOUT_S)
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

    keep = EmbeddedRedisKeeper(handle, limit).watch()    # ... keep() in the driver's loop ...; keep.stop()
    """

    def __init__(self, handle: RedisHandle, limit: int):
        self.handle, self.limit, self.restarts = handle, limit, 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: RedisUnavailable | None = None  # the watcher's: raised at the driver's next call

    def watch(self, interval_s: float = 1.0) -> "EmbeddedRedisKeeper":
        """Check every interval_s from a daemon thread until stop(). A server that thread starts is stopped when
        the thread ends (by the thread itself, and by Linux's parent-death signal, which also covers the process
        being killed: services.redis_server): call stop() after the handle is closed."""
        if self.handle.embedded and self._thread is None:
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
        finally:
            with self._lock:
                if started is not None and self.handle.process is started:
                    self.handle.stop()

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
            return False
        if self.restarts >= self.limit:
            raise RedisUnavailable(f"the embedded Redis exited again ({why}) after {self.restarts} restarts "
                                   f"(checkpoint.max_restarts); on a full disk, free space under "
                                   f"{self.handle.data_dir}, then resume")
        self.restarts += 1
        print(f"pcl: the embedded Redis exited ({why}); restarting it (restart {self.restarts} of {self.limit})",
              file=sys.stderr, flush=True)
        self.handle.revive(die_with_thread)
        return True
