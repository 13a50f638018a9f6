"""Exponential backoff and rate-limited failure logs for loops that retry: the workers' serving loops.

    backoff, report = Backoff(base_s=0.1, cap_s=30.0), FailureLog(log, "rollout-0", every_s=60.0)
    while running:
        try:
            serve_once()
        except Exception as exc:
            delay = backoff.next()
            report.failed(exc, delay)        # full traceback once per failure streak, then a line a minute
            stop.wait(delay)
        else:
            if backoff.failures:
                report.recovered()
                backoff.reset()

A loop that fails on every pass (Redis refusing writes, a broken engine) then waits 0.1, 0.2, 0.4, ... up to
30 s between passes instead of hammering the failing part, and its log holds one traceback and a summary
line a minute instead of a traceback per pass.
"""

from __future__ import annotations

import logging
import time


class Backoff:
    """Delays base_s, 2*base_s, 4*base_s, ... capped at cap_s; reset() after a success."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 30.0):
        if not 0 < base_s <= cap_s:
            raise ValueError(f"Backoff needs 0 < base_s ({base_s}) <= cap_s ({cap_s})")
        self.base_s, self.cap_s = base_s, cap_s
        self.failures = 0  # failures since the last reset

    def next(self) -> float:
        """The delay before the next attempt, counting one more failure."""
        self.failures += 1
        return min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 62))

    def reset(self) -> None:
        self.failures = 0


class FailureLog:
    """Logs a failure streak: the first failure (and any of a new kind) with its traceback, then at most one
    summary line per every_s seconds counting the failures in between, and one line when it recovers."""

    def __init__(self, logger: logging.Logger, name: str, every_s: float = 60.0):
        self.logger, self.name, self.every_s = logger, name, every_s
        self.streak = 0  # failures since the last recovery
        self.suppressed = 0  # failures not logged since the last line
        self.since = 0.0  # monotonic time the streak began
        self.last_line = 0.0  # monotonic time of the last line logged
        self.last_kind = ""

    def failed(self, exc: BaseException, retry_in_s: float) -> None:
        now, kind = time.monotonic(), f"{type(exc).__name__}: {exc}"[:300]
        self.streak += 1
        if self.streak == 1:
            self.since = now
        if self.streak == 1 or kind != self.last_kind:
            self.logger.error("%s: serving a batch failed (failure %d of this streak); its entries are handed back "
                              "and retried in %.1f s", self.name, self.streak, retry_in_s, exc_info=exc)
        elif now - self.last_line >= self.every_s:
            self.logger.warning("%s: still failing: %d failures in %.0f s (%d since the last line), retrying every "
                                "%.1f s; last error %s", self.name, self.streak, now - self.since,
                                self.suppressed + 1, retry_in_s, kind)
        else:
            self.suppressed += 1
            return
        self.suppressed, self.last_line, self.last_kind = 0, now, kind

    def recovered(self) -> None:
        if self.streak:
            self.logger.warning("%s: serving again after %d failures in %.1f s", self.name, self.streak,
                                time.monotonic() - self.since)
        self.streak = self.suppressed = 0
        self.last_kind = ""
