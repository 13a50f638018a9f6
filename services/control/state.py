"""A run's control state in Redis: what the control plane asks for, and what the coordinator did about it.

The control plane (`services/control/api.py`) and the coordinator never talk to each other directly; both read
and write these keys, so the control plane can run as its own process and outlive coordinator restarts. Every
key holds the run name, so runs sharing one Redis never collide:

    pcl:{run}:control    hash    what is asked for: paused (0/1), tau, k, checkpoint (a pending request),
                                 k_max (the largest k the training set allows, written by the driver)
    pcl:{run}:events     stream  every change: the API's requests, and what the coordinator applied with the
                                 step it took effect (capped at about EVENTS_MAXLEN entries)
    pcl:{run}:status     string  JSON the coordinator publishes at each step boundary
    pcl:{run}:history    zset    the figures of each step record, scored by step (the dashboard's plots)
    pcl:{run}:totals     hash    Prometheus counters and histogram buckets, accumulated over the whole run
    pcl:{run}:heartbeat  string  refreshed every few seconds by the coordinator, with a TTL (gone: it is gone)

One class per caller, each over the same keys (`ControlKeys`, here: the key names, what is asked for, the
event log, the published status):

    ControlReader    services/control/reads.py     status with live queue depths, history, totals (/metrics)
    ControlRequests  services/control/requests.py  the reader + pause / resume / params / checkpoint (the API)
    ControlWrites    services/control/writes.py    the driver's and the coordinator's writes (run.py, server.py)
    ControlStore     services/control/store.py     all of them: the driver serves the API over the state it resets

    store = ControlStore(make_client(url, decode_responses=True), "tiny")
    store.request_pause()                    # the API's side (the coordinator's: services/control/run.py)
    store.status()                           # published status + what is asked for + live queue depths

Steps are numbered as in metrics.jsonl: step S is the S-th training step. An event the coordinator records
carries `step` = the first step that runs with the change (a pause at step 4 means step 4 waits for resume).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from pcl.config import ControlConfig
from pcl.loop.record import StepRecord

EVENTS_MAXLEN = 10_000  # events kept (approximately); a pause/resume a minute for a week fits
HISTORY_MAXLEN = 50_000  # step records kept for the dashboard
HEARTBEAT_TTL_S = ControlConfig().heartbeat_ttl_s  # control.heartbeat_ttl_s's default: the coordinator's is its own

FINAL_STATES = ("finished", "failed")


class ControlConflict(RuntimeError):
    """The request contradicts the run's state (already paused, not paused, finished, no tau to set)."""


class ControlValueError(ValueError):
    """A value the run cannot take (k beyond what the training set allows)."""


@dataclass(frozen=True)
class Desired:
    """What the control plane asks for; None where the run's own value stands."""

    paused: bool = False
    tau: float | None = None
    k: int | None = None
    checkpoint: dict | None = None  # the pending checkpoint request: {"id", "requested_at"}
    k_max: int | None = None


def last_step(record: StepRecord) -> dict[str, Any]:
    """A step record as the control state keeps it (the status's last step, a history row): every figure of
    `pcl.loop.record.StepRecord` (and its `extra`) that is a number or null, or a dict of them (a figure by
    label, e.g. per worker)."""

    def kept(value: Any) -> bool:
        if isinstance(value, dict):
            return all(kept(v) for v in value.values())
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))

    return {key: value for key, value in record.to_dict().items() if kept(value)}


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def finite(value: Any) -> Any:
    """The value as strict JSON takes it: non-finite floats become null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {key: finite(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


class ControlKeys:
    """The Redis keys of one run's control state, what is asked for, the event log and the published status.
    The client must decode responses (decode_responses=True)."""

    def __init__(self, client: redis.Redis, run: str, depth_cache_s: float = 0.0):
        """`depth_cache_s`: queue depths are computed at most once per this many seconds (0: every call)."""
        if not run:
            raise ValueError(f"{type(self).__name__} needs a run name (run.name)")
        self.client, self.run = client, run
        self.depth_cache_s = depth_cache_s
        self._depths: tuple[float, dict[str, int]] | None = None  # (monotonic time computed, depths)
        self._depths_lock = threading.Lock()
        base = f"pcl:{run}"
        self.control_key, self.events_key = f"{base}:control", f"{base}:events"
        self.status_key, self.history_key = f"{base}:status", f"{base}:history"
        self.totals_key, self.heartbeat_key = f"{base}:totals", f"{base}:heartbeat"

    def desired(self) -> Desired:
        h = self.client.hgetall(self.control_key)
        return Desired(
            paused=h.get("paused") == "1",
            tau=float(h["tau"]) if "tau" in h else None,
            k=int(h["k"]) if "k" in h else None,
            checkpoint=loads(h.get("checkpoint")),
            k_max=int(h["k_max"]) if "k_max" in h else None,
        )

    def published(self) -> dict:
        """The status the coordinator last published ({} before it first did)."""
        return loads(self.client.get(self.status_key)) or {}

    def add_event(self, kind: str, source: str, step: int | None = None, **data: Any) -> dict:
        """Append an event; `step` is the step a change took effect at (coordinator events)."""
        event, fields = self._event(kind, source, step, data)
        event["id"] = self._append(self.client, fields)
        return event

    @staticmethod
    def _event(kind: str, source: str, step: int | None, data: dict) -> tuple[dict, dict]:
        """An event as returned to callers, and as the fields of its log entry."""
        event = {"type": kind, "source": source, "time": time.time(), "step": step, "data": data}
        fields = {"type": kind, "source": source, "time": repr(event["time"]), "data": json.dumps(data)}
        if step is not None:
            fields["step"] = str(step)
        return event, fields

    def _append(self, client: redis.Redis | redis.client.Pipeline, fields: dict):
        """XADD an event's fields to the log (the entry id, or the pipeline to execute)."""
        return client.xadd(self.events_key, fields, maxlen=EVENTS_MAXLEN, approximate=True)

    def events(self, after: str | None = None, limit: int = 200) -> list[dict]:
        """Events after the id `after` (oldest first), or the newest `limit` when after is None."""
        if after:
            entries = self.client.xrange(self.events_key, min=f"({after}", count=limit)
        else:
            entries = list(reversed(self.client.xrevrange(self.events_key, count=limit)))
        return [
            {
                "id": entry_id,
                "type": f["type"],
                "source": f["source"],
                "time": float(f["time"]),
                "step": int(f["step"]) if "step" in f else None,
                "data": json.loads(f.get("data", "{}")),
            }
            for entry_id, f in entries
        ]

    def _check_not_final(self, what: str) -> None:
        state = self.published().get("state")
        if state in FINAL_STATES:
            raise ControlConflict(f"cannot {what} the run: it has {state}")
