"""The control state as its readers see it: the status with the live queue depths, the step history, the
Prometheus totals (`services/control/metrics.py`; the API's reads, `services/control/requests.py`)."""

from __future__ import annotations

import json
import time

import redis

from services.control.state import ControlKeys
from services.streams.topology import STREAM_GROUPS, stream_key

_COUNT_AFTER = "return #redis.call('XRANGE', KEYS[1], ARGV[1], '+')"


class ControlReader(ControlKeys):
    """Reads of one run's control state; writes nothing."""

    def status(self) -> dict:
        """Published status, with what is asked for, the live queue depths and the coordinator's liveness."""
        status = {"run": self.run, "state": "waiting", "step": 0, **self.published()}
        desired = self.desired()
        beat = self.client.get(self.heartbeat_key)
        alive = beat is not None
        status["coordinator"] = {
            "alive": alive,
            "heartbeat_age_s": time.time() - float(beat) if alive else None,
        }
        if status["state"] in ("running", "paused") and not alive:
            status["state"] = "lost"  # published as live, but no heartbeat for control.heartbeat_ttl_s
        elif status["state"] == "running" and desired.paused:
            status["state"] = "pausing"
        elif status["state"] == "paused" and not desired.paused:
            status["state"] = "resuming"
        status["pause_requested"] = desired.paused
        status["pending_params"] = {
            key: getattr(desired, key)
            for key in ("tau", "k")
            if getattr(desired, key) is not None and getattr(desired, key) != status.get(key)
        }
        status["k_max"] = desired.k_max
        status["checkpoint"] = {**status.get("checkpoint", {}), "pending": desired.checkpoint}
        status["queue_depths"] = self.queue_depths()
        return status

    def queue_depths(self) -> dict[str, int]:
        """Entries of each work stream not yet acknowledged by its group (pending + not yet delivered), at most
        depth_cache_s old. Open reads (/v1/status, /metrics) call this, and on Redis < 7 a count runs a Lua
        XRANGE over the backlog that blocks Redis: however many clients ask, one computation per interval runs
        (concurrent callers wait for it rather than starting their own)."""
        with self._depths_lock:
            cached = self._depths
            if cached is None or time.monotonic() - cached[0] >= self.depth_cache_s or not self.depth_cache_s:
                cached = self._depths = (time.monotonic(), self._count_depths())
            return dict(cached[1])

    def _count_depths(self) -> dict[str, int]:
        depths = {}
        for name, group in STREAM_GROUPS.items():
            key = stream_key(self.run, name)
            try:
                info = next((g for g in self.client.xinfo_groups(key) if g["name"] == group), None)
            except redis.ResponseError:  # the stream does not exist yet
                info = None
            depths[name] = 0 if info is None else int(info["pending"]) + self._lag(key, info)
        return depths

    def _lag(self, key: str, info: dict) -> int:
        if info.get("lag") is not None:
            return int(info["lag"])
        # Redis < 7 reports no lag: count the entries after the group's cursor inside Redis (the entries hold
        # binary payloads of up to megabytes, which need not travel for a count).
        return int(self.client.eval(_COUNT_AFTER, 1, key, f"({info['last-delivered-id']}"))

    def history(self, after_step: int = -1, limit: int = 5000) -> list[dict]:
        """Step records with step > after_step, oldest first."""
        return self.history_page(after_step, limit)[0]

    def history_page(self, after_step: int, limit: int, max_bytes: float = float("inf")) -> tuple[list[dict], bool]:
        """At most `limit` step records with step > after_step, oldest first, and no more of them than fit in
        `max_bytes` of JSON (always one); and whether more follow."""
        rows = self.client.zrangebyscore(self.history_key, f"({after_step}", "+inf", start=0, num=limit + 1)
        kept, size = 0, 0
        for row in rows[:limit]:
            size += len(row.encode() if isinstance(row, str) else row) + 2  # the separator between records
            if kept and size > max_bytes:
                break
            kept += 1
        return [json.loads(row) for row in rows[:kept]], kept < len(rows)

    def totals(self) -> dict[str, float]:
        return {key: float(value) for key, value in self.client.hgetall(self.totals_key).items()}
