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
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from pcl.loop.record import StepRecord
from services.streams.topology import STREAM_GROUPS, stream_key

EVENTS_MAXLEN = 10_000  # events kept (approximately); a pause/resume a minute for a week fits
HISTORY_MAXLEN = 50_000  # step records kept for the dashboard
HEARTBEAT_TTL_S = 30.0

FINAL_STATES = ("finished", "failed")


_COUNT_AFTER = "return #redis.call('XRANGE', KEYS[1], ARGV[1], '+')"


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


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _finite(value: Any) -> Any:
    """The value as strict JSON takes it: non-finite floats become null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {key: _finite(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


class ControlStore:
    """The Redis keys of one run's control state. The client must decode responses (decode_responses=True)."""

    def __init__(self, client: redis.Redis, run: str, depth_cache_s: float = 0.0):
        """`depth_cache_s`: queue depths are computed at most once per this many seconds (0: every call)."""
        if not run:
            raise ValueError("ControlStore needs a run name (run.name)")
        self.client, self.run = client, run
        self.depth_cache_s = depth_cache_s
        self._depths: tuple[float, dict[str, int]] | None = None  # (monotonic time computed, depths)
        self._depths_lock = threading.Lock()
        base = f"pcl:{run}"
        self.control_key, self.events_key = f"{base}:control", f"{base}:events"
        self.status_key, self.history_key = f"{base}:status", f"{base}:history"
        self.totals_key, self.heartbeat_key = f"{base}:totals", f"{base}:heartbeat"

    # -- what is asked for ----------------------------------------------------------------------------------

    def desired(self) -> Desired:
        h = self.client.hgetall(self.control_key)
        return Desired(
            paused=h.get("paused") == "1",
            tau=float(h["tau"]) if "tau" in h else None,
            k=int(h["k"]) if "k" in h else None,
            checkpoint=_loads(h.get("checkpoint")),
            k_max=int(h["k_max"]) if "k_max" in h else None,
        )

    def request_pause(self) -> dict:
        """Ask the coordinator to pause at the next step boundary (the step in flight completes)."""
        self._check_not_final("pause")
        event = self._flip_paused("0", "1", "pause_requested")
        if event is None:
            raise ControlConflict("the run is already paused (or pausing at the next step boundary)")
        return event

    def request_resume(self) -> dict:
        self._check_not_final("resume")
        event = self._flip_paused("1", "0", "resume_requested")
        if event is None:
            raise ControlConflict("the run is not paused")
        return event

    def request_params(self, tau: float | None = None, k: int | None = None) -> dict:
        """Ask for a new tau and/or k from the next step on."""
        self._check_not_final("change parameters of")
        published = self.published()
        changes = {key: value for key, value in (("tau", tau), ("k", k)) if value is not None}
        if not changes:
            raise ControlValueError("give tau and/or k")
        fixed = [key for key in changes if key not in published.get("tunable", ("tau", "k"))]
        if fixed:
            raise ControlConflict(
                f"selection strategy {published.get('strategy')!r} has no {' or '.join(fixed)} to set"
            )
        k_max = self.desired().k_max
        if k is not None and k_max is not None and k > k_max:
            raise ControlValueError(
                f"k={k} exceeds k_max={k_max}: k*m candidates must not exceed the training set"
            )
        event, fields = self._event("params_requested", "api", None,
                                    dict(last_step=published.get("step"), **changes))
        pipe = self.client.pipeline(transaction=True)  # the request is logged before anyone can apply it
        pipe.hset(self.control_key, mapping={key: str(value) for key, value in changes.items()})
        self._append(pipe, fields)
        event["id"] = pipe.execute()[-1]
        return event

    def request_checkpoint(self) -> dict:
        """Record a checkpoint request; the coordinator sees it at the next step boundary."""
        self._check_not_final("checkpoint")
        request = {"id": uuid.uuid4().hex[:12], "requested_at": time.time()}
        if not self.client.hsetnx(self.control_key, "checkpoint", json.dumps(request)):
            pending = self.desired().checkpoint or {}
            raise ControlConflict(f"checkpoint request {pending.get('id')!r} is still pending")
        self.add_event(
            "checkpoint_requested", "api", request_id=request["id"], last_step=self.published().get("step")
        )
        return request

    def _flip_paused(self, old: str, new: str, kind: str) -> dict | None:
        """Set paused from old to new and log event `kind`, in one transaction: the coordinator never sees the
        new value before the event that asked for it is in the log. None (nothing written) when it was not
        old."""
        event, fields = self._event(kind, "api", None, {"last_step": self.published().get("step")})

        def flip(pipe: redis.client.Pipeline) -> None:
            if (pipe.hget(self.control_key, "paused") or "0") == old:
                pipe.multi()
                pipe.hset(self.control_key, "paused", new)
                self._append(pipe, fields)

        written = self.client.transaction(flip, self.control_key)  # retried while the key changes under it
        if not written:
            return None
        event["id"] = written[-1]
        return event

    def _check_not_final(self, what: str) -> None:
        state = self.published().get("state")
        if state in FINAL_STATES:
            raise ControlConflict(f"cannot {what} the run: it has {state}")

    # -- what happened -------------------------------------------------------------------------------------

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

    def published(self) -> dict:
        """The status the coordinator last published ({} before it first did)."""
        return _loads(self.client.get(self.status_key)) or {}

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
            status["state"] = "lost"  # published as live, but no heartbeat for HEARTBEAT_TTL_S
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
        rows = self.client.zrangebyscore(self.history_key, f"({after_step}", "+inf", start=0, num=limit)
        return [json.loads(row) for row in rows]

    def totals(self) -> dict[str, float]:
        return {key: float(value) for key, value in self.client.hgetall(self.totals_key).items()}

    # -- the driver's and the coordinator's writes -----------------------------------------------------------

    def reset(self) -> None:
        """Forget a previous run of the same name (a fresh run; a resumed run keeps its state)."""
        self.client.delete(
            self.control_key,
            self.events_key,
            self.status_key,
            self.history_key,
            self.totals_key,
            self.heartbeat_key,
        )

    def reopen(self) -> None:
        """A resumed run: keep its state, but it is no longer finished or failed (mutations are welcome)."""
        status = self.published()
        if status.get("state") in FINAL_STATES:
            self.write_status({**status, "state": "waiting", "error": None})

    def snapshot(self) -> dict:
        """The control state a checkpoint keeps: what is asked for (tau, k, pause; not a pending checkpoint
        request) and the event log."""
        desired = {k: v for k, v in self.client.hgetall(self.control_key).items() if k != "checkpoint"}
        raw = self.client.xrange(self.events_key)
        return {"desired": desired, "events": [{"id": entry_id, "fields": fields} for entry_id, fields in raw]}

    def restore(self, snapshot: dict) -> bool:
        """Put a checkpoint's control state back when Redis holds none for this run (a new or emptied Redis);
        state already there is newer than the checkpoint's and stays. Returns whether anything was restored."""
        if self.client.exists(self.control_key, self.events_key):
            return False
        pipe = self.client.pipeline(transaction=True)
        if snapshot.get("desired"):
            pipe.hset(self.control_key, mapping=snapshot["desired"])
        for event in snapshot.get("events", []):
            pipe.xadd(self.events_key, event["fields"], id=event["id"])
        pipe.execute()
        return True

    def override_params(self, values: dict[str, Any], source: str = "driver") -> dict[str, Any]:
        """A resumed run's explicit overrides win over what the control plane asked for before (pcl.loop.resume):
        where the hash holds another tau / k, it is set to the override, with a `params_overridden` event.
        Returns the replaced values ({} when the hash held none that differed)."""
        held = self.client.hgetall(self.control_key)
        replaced = {key: held[key] for key in ("tau", "k") if key in values and key in held
                    and held[key] != str(values[key])}
        if not replaced:
            return {}
        changes = {key: values[key] for key in replaced}
        _, fields = self._event("params_overridden", source, None, dict(previous=replaced, **changes))
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self.control_key, mapping={key: str(value) for key, value in changes.items()})
        self._append(pipe, fields)
        pipe.execute()
        return replaced

    def set_k_max(self, k_max: int) -> None:
        self.client.hset(self.control_key, "k_max", str(k_max))

    def write_status(self, status: dict) -> None:
        self.client.set(self.status_key, json.dumps(_finite(status), allow_nan=False))

    def add_history(self, record: StepRecord | dict) -> None:
        """Store a step's record (its figures, nulls left out); records of later steps (left by a run this one
        resumed) are dropped."""
        record = StepRecord.coerce(record)
        row = {key: value for key, value in _finite(last_step(record)).items() if value is not None}
        step = int(record.step)
        pipe = self.client.pipeline()
        pipe.zremrangebyscore(self.history_key, step, "+inf")
        pipe.zadd(self.history_key, {json.dumps(row): step})
        pipe.zremrangebyrank(self.history_key, 0, -HISTORY_MAXLEN - 1)
        pipe.execute()

    def add_totals(self, increments: dict[str, float]) -> None:
        pipe = self.client.pipeline(transaction=True)
        for key, value in increments.items():
            if isinstance(value, int):
                pipe.hincrby(self.totals_key, key, value)
            else:
                pipe.hincrbyfloat(self.totals_key, key, value)
        pipe.execute()

    def beat(self) -> None:
        self.client.set(self.heartbeat_key, repr(time.time()), ex=int(HEARTBEAT_TTL_S))

    def clear_heartbeat(self) -> None:
        self.client.delete(self.heartbeat_key)

    def clear_checkpoint(self, request_id: str) -> bool:
        """Drop the pending checkpoint request if it is still `request_id`; False when it was not."""

        def clear(pipe: redis.client.Pipeline) -> bool:
            pending = _loads(pipe.hget(self.control_key, "checkpoint"))
            if not pending or pending.get("id") != request_id:
                return False
            pipe.multi()
            pipe.hdel(self.control_key, "checkpoint")
            return True

        return self.client.transaction(clear, self.control_key, value_from_callable=True)
