"""The driver's and the coordinator's writes to a run's control state: a fresh or resumed run's state, the status
and history published after each step, the totals, the heartbeat, a served checkpoint request."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from pcl.loop.record import StepRecord
from services.control.state import (
    FINAL_STATES, HEARTBEAT_TTL_S, HISTORY_MAXLEN, ControlKeys, finite, last_step, loads,
)


class ControlWrites(ControlKeys):
    """The writes of the driver (`services/control/server.py`) and the coordinator (`services/control/run.py`)."""

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
        self.client.set(self.status_key, json.dumps(finite(status), allow_nan=False))

    def add_history(self, record: StepRecord | dict) -> None:
        """Store a step's record (its figures, nulls left out); records of later steps (left by a run this one
        resumed) are dropped."""
        record = StepRecord.coerce(record)
        row = {key: value for key, value in finite(last_step(record)).items() if value is not None}
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

    def beat(self, ttl_s: float = HEARTBEAT_TTL_S) -> None:
        """The coordinator is alive: its heartbeat key, gone after ttl_s without another beat."""
        self.client.set(self.heartbeat_key, repr(time.time()), px=max(1, round(ttl_s * 1000)))

    def clear_heartbeat(self) -> None:
        self.client.delete(self.heartbeat_key)

    def clear_checkpoint(self, request_id: str) -> bool:
        """Drop the pending checkpoint request if it is still `request_id`; False when it was not."""

        def clear(pipe: redis.client.Pipeline) -> bool:
            pending = loads(pipe.hget(self.control_key, "checkpoint"))
            if not pending or pending.get("id") != request_id:
                return False
            pipe.multi()
            pipe.hdel(self.control_key, "checkpoint")
            return True

        return self.client.transaction(clear, self.control_key, value_from_callable=True)
