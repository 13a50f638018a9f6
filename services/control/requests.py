"""What the control plane's API asks of a run (pause, resume, new tau / k, a checkpoint), logged as events; the
coordinator applies them at the next step boundary (`services/control/run.py`). Each request is one Redis
transaction (the change and its event), so a request the API retries while Redis restarts is recorded whole or
not at all (`services/control/outage.py`)."""

from __future__ import annotations

import json
import time
import uuid

import redis

from services.control.reads import ControlReader
from services.control.state import ControlConflict, ControlValueError


class ControlRequests(ControlReader):
    """The API's side of one run's control state: its reads and its requests."""

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
        """Record a checkpoint request; the coordinator sees it at the next step boundary. The request and its
        event are one transaction: both are recorded, or neither."""
        self._check_not_final("checkpoint")
        request = {"id": uuid.uuid4().hex[:12], "requested_at": time.time()}
        _, fields = self._event("checkpoint_requested", "api", None,
                                {"request_id": request["id"], "last_step": self.published().get("step")})

        def record(pipe: redis.client.Pipeline) -> bool:
            if pipe.hexists(self.control_key, "checkpoint"):
                return False
            pipe.multi()
            pipe.hset(self.control_key, "checkpoint", json.dumps(request))
            self._append(pipe, fields)
            return True

        if not self.client.transaction(record, self.control_key, value_from_callable=True):
            pending = self.desired().checkpoint or {}
            raise ControlConflict(f"checkpoint request {pending.get('id')!r} is still pending")
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
