"""The actors of a run, by role: what `entrypoints.fleet.start_fleet` starts and the coordinator drives.

    handles = FleetHandles(redis_url, policy_path, value_path, sampler, scorer, verifiers, rollout_workers, learners)
    handles.rollout_workers[0].ping.remote()
    health = ActorHealth(handles.named)        # each actor's word, looked at after every step
    control = RunControl.for_coordinator(cfg, handles.redis_url, health=health)   # services.control.run

`ActorHealth` is the control plane's view of the actors (`services.control.run` imports no Ray: it is given this
callable), one word per actor: 'ok', 'stopped' (its serving loop ended), 'unresponsive', 'dead'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import time
from typing import Any, Callable

import ray


@dataclass
class FleetHandles:
    """Handles on every actor of a run and where its models and Redis are; passed to the coordinator."""

    redis_url: str
    policy_path: str | None = None  # the policy's local copy (the rollout workers' and the learners' model.path)
    value_path: str | None = None  # V's local copy
    sampler: Any = None  # PromptSamplerActor
    scorer: Any = None  # ValueScorerActor, None when the strategy needs no values
    verifiers: list = field(default_factory=list)  # RewardVerifier actors
    rollout_workers: list = field(default_factory=list)  # RolloutWorker actors
    learners: Any = None  # actors.learner.LearnerGroup

    def named(self) -> dict[str, Any]:
        """Every actor handle by a readable name (sampler, scorer, learner-i, rollout-i, verifier-i)."""
        actors = {"sampler": self.sampler, "scorer": self.scorer}
        actors.update({f"learner-{i}": rank for i, rank in enumerate(getattr(self.learners, "ranks", []))})
        actors.update({f"rollout-{i}": w for i, w in enumerate(self.rollout_workers)})
        actors.update({f"verifier-{i}": v for i, v in enumerate(self.verifiers)})
        return {name: handle for name, handle in actors.items() if handle is not None}


class ActorHealth:
    """Per named actor: 'ok', 'stopped' (its ping answered False), 'unresponsive' (no answer in timeout_s), 'dead'
    (the call failed). Looked at after every step: an actor whose last ping is still unanswered is not asked again
    nor waited for (a frozen process costs the ping timeout once, not once a step, and holds one ping, not one per
    step): it is 'unresponsive' once that ping is older than timeout_s, and keeps its last word until then.

        health = ActorHealth(fleet.named, timeout_s=2.0)
        health()   # {"rollout-0": "ok", "rollout-1": "unresponsive", ...}
    """

    def __init__(self, actors: Callable[[], dict[str, Any]], timeout_s: float = 2.0):
        self.actors, self.timeout_s = actors, timeout_s
        self.pending: dict[str, tuple[Any, float]] = {}  # name -> (its unanswered ping, when it was asked)
        self.words: dict[str, str] = {}  # the last word of each actor

    def __call__(self) -> dict[str, str]:
        actors = self.actors()
        asked = {}
        for name, handle in actors.items():
            if name in self.pending:
                continue
            try:
                asked[name] = handle.ping.remote()
                self.pending[name] = (asked[name], time.monotonic())
            except Exception:  # noqa: BLE001 - a handle that cannot take a call is as good as dead
                self.words[name] = "dead"
        refs = [ref for ref, _ in self.pending.values()]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        fresh = [ref for ref in asked.values() if ref not in ready]
        if fresh:  # only the pings asked now are waited for
            ready |= set(ray.wait(fresh, num_returns=len(fresh), timeout=self.timeout_s)[0])
        now = time.monotonic()
        for name, (ref, since) in list(self.pending.items()):
            if ref in ready:
                del self.pending[name]
                self.words[name] = _answer(ref)
            elif now - since >= self.timeout_s or name in asked:
                self.words[name] = "unresponsive"
        return {name: self.words.get(name, "ok") for name in actors}


def _answer(ref) -> str:
    try:
        return "ok" if ray.get(ref) else "stopped"
    except Exception:  # noqa: BLE001 - RayActorError and friends
        return "dead"
