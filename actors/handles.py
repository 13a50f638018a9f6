"""The actors of a run, by role: what `entrypoints.fleet.start_fleet` starts and the coordinator drives.

    handles = FleetHandles(redis_url, policy_path, value_path, sampler, scorer, verifiers, rollout_workers, learners)
    handles.rollout_workers[0].ping.remote()
    control = RunControl.for_coordinator(cfg, handles.redis_url, health=handles.health)   # services.control.run

`health()` is the control plane's view of the actors (`services.control.run` imports no Ray: it is given this
method), one word per actor: 'ok', 'stopped' (its serving loop ended), 'unresponsive', 'dead'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    def health(self, timeout_s: float = 2.0) -> dict[str, str]:
        """Per actor: 'ok', 'stopped' (serving loop ended), 'unresponsive' (no answer in timeout_s), 'dead'."""
        return actor_health(self.named(), timeout_s)


def actor_health(actors: dict[str, Any], timeout_s: float = 2.0) -> dict[str, str]:
    """Per named actor handle: 'ok', 'stopped' (ping answered False), 'unresponsive' (no answer in timeout_s),
    'dead' (the call failed)."""
    health: dict[str, str] = {}
    refs = {}
    for name, handle in actors.items():
        try:
            refs[name] = handle.ping.remote()
        except Exception:  # noqa: BLE001 - a handle that cannot take a call is as good as dead
            health[name] = "dead"
    ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)[0]) if refs else set()
    for name, ref in refs.items():
        if ref not in ready:
            health[name] = "unresponsive"
            continue
        try:
            health[name] = "ok" if ray.get(ref) else "stopped"
        except Exception:  # noqa: BLE001 - RayActorError and friends
            health[name] = "dead"
    return health
