"""What the coordinator does after each look at its fleet's progress (`services.streams.stragglers.StragglerWatch`,
while it waits for a step): rollout stragglers are left out of the next chunks and weight syncs
(`actors.ports.FleetLearner.watched`), and stuck workers are restarted.

A rollout worker or verifier that has made no progress for its stuck
timeout (`rollout.stuck_timeout_s`, `verifier.stuck_timeout_s`; `services.streams.stragglers.StragglerWatch.stuck`
names them from their heartbeats) is restarted through Ray's own restart: its process is killed
(`ray.kill(..., no_restart=False)`, which ends a stopped process too) and Ray starts the actor again, as after a
crash. A restarted rollout worker serves nothing until the coordinator gives it the current weights
(`FleetLearner.check_fleet`); a restarted verifier reads the gold answers from Redis and serves.

    repair = FleetRepair(learner, fleet.named())    # the FleetLearner; handles by instance (actors.handles)
    client = RolloutClient(cfg, redis_url, learner.live_workers, on_watch=repair)
    repair.restarts                                 # {"rollout-1": 1}: the step record's stuck_restarts_by_worker

Each stuck process is killed once (by its incarnation), and only when it is the process of the actor this
coordinator holds: the heartbeat names its Ray actor, so a process of an earlier attempt of the run is left alone.
"""

from __future__ import annotations

import logging
from collections import Counter

import ray

log = logging.getLogger(__name__)


def actor_id(handle) -> str:
    """The Ray actor id of a handle, as an actor's runtime context gives its own (hex)."""
    return handle._actor_id.hex()  # noqa: SLF001 - the handle has no public accessor in Ray 2.x


class FleetRepair:
    """Called with the watch after each look: tells the learner side who straggles, and kills the process of each
    stuck worker once so that Ray restarts it (counted by instance)."""

    def __init__(self, learner, handles: dict):
        self.learner = learner
        self.handles = {name: h for name, h in handles.items() if name.startswith(("rollout-", "verifier-"))}
        self.ids = {name: actor_id(h) for name, h in self.handles.items()}
        self.killed: set[str] = set()  # incarnations killed
        self.restarts: Counter[str] = Counter()

    def __call__(self, watch) -> None:
        self.learner.watched(watch)
        for state in watch.stuck():
            if state.incarnation in self.killed or self.ids.get(state.instance) != state.actor:
                continue
            log.warning("%s (process %s) made no progress for %.0f s, past its stuck timeout: restarting it",
                        state.instance, state.incarnation, state.stalled_s)
            self.killed.add(state.incarnation)
            self.restarts[state.instance] += 1
            try:
                ray.kill(self.handles[state.instance], no_restart=False)
            except Exception as exc:  # noqa: BLE001 - a handle Ray no longer knows: nothing to restart
                log.warning("restarting %s failed: %r", state.instance, exc)
