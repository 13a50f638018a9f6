"""The coordinator's side of the control state: applied at step boundaries, published after each step.

    control = RunControl.for_coordinator(cfg, redis_url, health)   # in the coordinator's __init__
    ...
    paused_s = control.at_step_boundary(step, strategy)       # before each step: tau / k, pause (blocks)
    record = train_step(step)
    control.publish(record, policy_version)                   # status, history, Prometheus totals
    ...
    control.finish(steps_done)

Everything the control plane asked for (services/control/state.py) takes effect here, between two steps: the
step in flight always completes, and a change is recorded in the event log with the step it took effect at.
The control channel never stops training: when Redis does not answer, the step goes on with the values it
had (a pause already in force holds until Redis answers again).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import redis

from pcl.loop.curriculum_window import ADVICE
from pcl.loop.record import StepRecord
from services.control.state import HEARTBEAT_TTL_S, Desired, last_step
from services.control.writes import ControlWrites
from services.control.metrics import observation_increments

log = logging.getLogger(__name__)


class RunControl:
    """Applies the control state to a running coordinator, and publishes what it does."""

    def __init__(
        self,
        store: ControlWrites,
        health: Callable[[], dict[str, str]] | None = None,
        steps_total: int | None = None,
        poll_s: float = 0.25,
        heartbeat_s: float = 5.0,
        heartbeat_ttl_s: float = HEARTBEAT_TTL_S,
    ):
        """health(): each actor's state by name ('ok', 'stopped', 'unresponsive', 'dead'), published with the
        status after each step; the actor layer provides it (`actors.handles.ActorHealth`)."""
        self.store, self.health, self.poll_s = store, health, poll_s
        self.status: dict[str, Any] = {
            "run": store.run,
            "state": "running",
            "step": 0,
            "paused": False,
            "steps_total": steps_total,
            "started_at": time.time(),
        }
        self.desired = Desired()
        self.counted: dict[str, float] = {}  # counters of the step record already added to the totals
        self.ignored: set[tuple[str, float]] = set()  # changes refused once (not repeated every step)
        self._warned_at = 0.0
        self._stop = threading.Event()
        self._ttl_s = heartbeat_ttl_s  # no beat for this long: the status says "lost" (control.heartbeat_ttl_s)
        self._safely(lambda: store.beat(self._ttl_s))  # alive from the start, not from the thread's first turn
        self._heartbeat = threading.Thread(
            target=self._beat, args=(heartbeat_s,), name="pcl-heartbeat", daemon=True
        )
        self._heartbeat.start()

    @classmethod
    def for_coordinator(cls, cfg, redis_url: str, health: Callable[[], dict[str, str]] | None = None) -> "RunControl":
        """The control of the run `cfg` describes, on the fleet's Redis."""
        from services.redis_server import make_client

        store = ControlWrites(make_client(redis_url, "coordinator-control", decode_responses=True), cfg.run.name)
        return cls(store, health, steps_total=cfg.run.steps, heartbeat_ttl_s=cfg.control.heartbeat_ttl_s)

    # -- step boundaries -------------------------------------------------------------------------------------

    def at_step_boundary(self, step: int, strategy, on_checkpoint=None) -> float:
        """Before training step `step` (0-based; metrics.jsonl calls it step+1): apply tau / k, see a
        checkpoint request, and block while paused; `on_checkpoint()` is called for a checkpoint requested
        during a pause (the run's state then is that of the step boundary). Returns the seconds spent paused."""
        self._describe(strategy)
        desired = self._read()
        if desired is not None:
            self._apply(desired, step + 1, strategy)
        if desired is None or not desired.paused:
            self._write_status(state="running", paused=False)
            return 0.0
        start = time.monotonic()
        self._event("paused", step + 1)
        self._write_status(state="paused", paused=True)
        while desired is None or desired.paused:
            time.sleep(self.poll_s)
            desired = self._read()
            if desired is not None and self._apply(desired, step + 1, strategy):
                self._describe(strategy)
                self._write_status()
            if on_checkpoint is not None and self.checkpoint_requested():
                on_checkpoint()
        paused_s = time.monotonic() - start
        self._event("resumed", step + 1, paused_seconds=round(paused_s, 3))
        self._write_status(state="running", paused=False)
        return paused_s

    def publish(self, record: StepRecord | dict, policy_version: int) -> None:
        """After a step (or the step-0 evaluation) is logged: status, history and Prometheus totals."""
        record = StepRecord.coerce(record)
        self.status.update(step=int(record.step), policy_version=policy_version)
        if record.eval_accuracy is not None:
            self.status["eval"] = {"step": int(record.step), "accuracy": record.eval_accuracy}
        increments = {}
        if record.is_training_step:  # a training step, not the evaluation before the first one
            self._curriculum_events(record, self.status.get("last_step") or {})
            self.status["last_step"] = last_step(record)
            increments = observation_increments(record, self.counted)
            if self.health is not None:
                self.status["actors"] = self.health()

        def write() -> None:
            self.store.add_history(record)
            if increments:
                self.store.add_totals(increments)

        self._safely(write)
        self._write_status()

    def checkpoint_requested(self) -> str | None:
        """Id of the checkpoint request pending at the last step boundary, or None."""
        return (self.desired.checkpoint or {}).get("id")

    def checkpoint_done(self, request_id: str | None, path: str) -> None:
        """A checkpoint was written (on request, or on schedule when request_id is None)."""
        step = self.status["step"]
        if request_id is not None:
            self._safely(lambda: self.store.clear_checkpoint(request_id))
            self.desired = Desired(**{**self.desired.__dict__, "checkpoint": None})
        self.status["checkpoint"] = {
            "last": {"step": step, "path": path, "request_id": request_id, "time": time.time()}
        }
        self._event("checkpoint_written", step, path=path, request_id=request_id)
        self._write_status()

    def snapshot(self) -> dict:
        """The control state for a checkpoint ({} when Redis does not answer)."""
        return self._safely(self.store.snapshot) or {}

    def finish(self, steps_done: int) -> None:
        """The run ended normally: final status, an event, and no more heartbeat."""
        self._stop.set()
        self._heartbeat.join(timeout=5)
        self._event("finished", steps_done)
        self._write_status(state="finished", paused=False)
        self._safely(self.store.clear_heartbeat)

    # -- the pieces ------------------------------------------------------------------------------------------

    def _curriculum_events(self, record: StepRecord, previous: dict) -> None:
        """`curriculum_stalled` the step the curriculum's gain over uniform selection has stayed low for
        curriculum.patience steps (with what to change), `curriculum_recovered` the step it pays again."""
        gain = {"curriculum_gain": record.curriculum_gain, "uniform_effective_ratio": record.uniform_effective_ratio}
        if record.curriculum_stalled == 1:
            self._event("curriculum_stalled", int(record.step), **gain, advice=ADVICE)
        elif record.curriculum_stalled == 0 and previous.get("curriculum_stalled"):
            self._event("curriculum_recovered", int(record.step), **gain,
                        stalled_steps=previous["curriculum_stalled"])

    def _apply(self, desired: Desired, step: int, strategy) -> bool:
        """Tune tau / k on the strategy (`Strategy.tune`, which validates) and record it; a change the strategy
        cannot take is refused once, as an event. Returns whether anything changed."""
        self.desired = desired
        wanted = {}
        for key in ("tau", "k"):
            value = getattr(desired, key)
            if value is None or (key, value) in self.ignored:
                continue
            reason = None
            if key not in strategy.tunable:
                reason = f"selection strategy {strategy.name!r} has no {key}"
            elif key == "k" and desired.k_max is not None and value > desired.k_max:
                reason = f"k={value} exceeds k_max={desired.k_max}"
            else:
                try:
                    strategy.tunable[key].check(key, value)
                    wanted[key] = value
                except ValueError as exc:
                    reason = str(exc)
            if reason is not None:
                self.ignored.add((key, value))
                self._event("params_refused", step, reason=reason, **{key: value})
        changed = strategy.tune(**wanted) if wanted else {}
        if changed:
            self._event("params_applied", step, previous={key: old for key, (old, _) in changed.items()},
                        **{key: new for key, (_, new) in changed.items()})
        return bool(changed)

    def _describe(self, strategy) -> None:
        self.status.update(
            strategy=strategy.name,
            tunable=[key for key in ("tau", "k") if key in strategy.tunable],
            tau=getattr(strategy, "tau", None),
            k=getattr(strategy, "k", None),
        )

    def _event(self, kind: str, step: int, **data: Any) -> None:
        self._safely(lambda: self.store.add_event(kind, "coordinator", step=step, **data))

    def _read(self) -> Desired | None:
        return self._safely(self.store.desired)

    def _write_status(self, **changes: Any) -> None:
        self.status.update(changes, updated_at=time.time())
        self._safely(lambda: self.store.write_status(self.status))

    def _beat(self, every_s: float) -> None:
        while not self._stop.is_set():
            self._safely(lambda: self.store.beat(self._ttl_s))
            self._stop.wait(min(every_s, self._ttl_s / 3))

    def _safely(self, operation):
        """Run a Redis operation; on a Redis error log it (at most every 30 s) and return None."""
        try:
            return operation()
        except (redis.RedisError, OSError) as exc:
            if time.monotonic() - self._warned_at > 30:
                self._warned_at = time.monotonic()
                log.warning("control state on Redis unavailable (%s); training goes on", exc)
            return None
