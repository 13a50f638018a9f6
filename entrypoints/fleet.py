"""Placing the actors of a run:

    fleet = start_fleet(cfg, prepared, redis_url)       # sampler, scorer, learner ranks, workers, coordinator
    ...
    fleet.stop()                                        # its actors, then its placement groups

    kept = fleet.salvage(cfg)                           # a failure: the actors that can go on, the rest removed
    fleet = start_fleet(cfg, prepared, redis_url, kept=kept)   # starts only what is missing, then restore

A restart from a checkpoint keeps what survived: every actor that answers at once (its serving loop stopped and
started again after the streams are purged) and restores it from the checkpoint like a new one, so a lost
coordinator costs one coordinator's start, not eight actors'. The coordinator is always new; the learner ranks
are kept or replaced together (they share a process group); with `rollout.weight_sync: collective` the learner
and the rollout workers share a weight group too, so they are replaced together.

The learner ranks, V's ranks and each rollout engine go into placement groups (`pcl.tools.placement`), reserved
before any actor starts: a group the cluster cannot hold is refused with the role, its bundles and what the
cluster has (`PlacementError`, a ConfigError), and the groups already made are removed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray

from actors.handles import FleetHandles
from pcl.config import Config, ConfigError
from pcl.tools.placement import RoleGroup, placement_plan
from services.redis_keeper import wait_while_full
from services.streams.rollout_client import publish_answers

log = logging.getLogger(__name__)


@dataclass
class Fleet:
    """The coordinator and the actors it drives (`actors.handles.FleetHandles`)."""

    coordinator: object
    handles: FleetHandles
    placement: "Placement | None" = None

    def salvage(self, cfg: Config, wait_s: float | None = None) -> "Fleet":
        """After a failure, before a restart from a checkpoint: the actors that can go on, the rest killed. Rollout
        workers and verifiers stop their serving loops (nothing of the failed attempt is written after the
        streams are purged; a worker Ray is restarting is kept once it is up); the learner ranks, V and the
        sampler must answer a ping within `wait_s` (checkpoint.restart_wait_s; a rank stuck in a collective with a
        lost peer does not). The coordinator is always killed. Returns a Fleet of the kept handles (None where one
        is lost) and the placement groups, for `start_fleet(kept=...)`."""
        h, actors = self.handles, self.handles.named()
        if self.coordinator is not None:
            ray.kill(self.coordinator, no_restart=True)
        serving = ("rollout-", "verifier-")
        calls = {name: (a.quiesce if name.startswith(serving) else a.ping).remote() for name, a in actors.items()}
        wait_s = wait_s or cfg.checkpoint.restart_wait_s
        lost = {name for name, ok in zip(calls, _answers(list(calls.values()), wait_s)) if not ok}  # asked at once
        ranks = {name for name in actors if name.startswith("learner-")}
        if cfg.rollout.weight_sync == "collective":  # learner and workers share a weight group
            lost |= ranks | {name for name in actors if name.startswith("rollout-")}
        if lost & ranks:  # one process group
            lost |= ranks
        for name in lost:
            ray.kill(actors[name], no_restart=True)
        keep = lambda name: None if name in lost else actors.get(name)  # noqa: E731
        kept = FleetHandles(h.redis_url, h.policy_path, h.value_path, sampler=keep("sampler"), scorer=keep("scorer"),
                            verifiers=[keep(f"verifier-{i}") for i in range(len(h.verifiers))],
                            rollout_workers=[keep(f"rollout-{i}") for i in range(len(h.rollout_workers))],
                            learners=h.learners if ranks and not lost & ranks else None)
        return Fleet(None, kept, self.placement)

    def stop(self) -> None:
        """Stop serving loops politely, then remove every actor."""
        h = self.handles
        workers = [w for w in h.rollout_workers + h.verifiers if w is not None]  # None: lost, not started again
        try:
            ray.get([w.shutdown.remote() for w in workers], timeout=20)
        except Exception as exc:  # noqa: BLE001 - best effort; the actors are killed next
            log.warning("stopping workers: %s", exc)
        for actor in workers + [h.sampler, h.scorer, self.coordinator]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        if h.learners is not None:
            h.learners.kill()
        if self.placement is not None:
            self.placement.remove()


class PlacementError(ConfigError):
    """A placement group the cluster cannot hold (names the role, its settings, bundles and the cluster)."""


@dataclass
class Placement:
    """The run's placement groups by role (`pcl.tools.placement.placement_plan`); `at(role, i)` is the scheduling
    strategy of the role's i-th bundle."""

    groups: dict

    def at(self, role: str, index: int = 0):
        from actors.runtime import in_bundle

        return in_bundle(self.groups[role], index)["scheduling_strategy"]

    def remove(self) -> None:
        from ray.util import remove_placement_group

        for group in self.groups.values():
            try:
                remove_placement_group(group)
            except Exception as exc:  # noqa: BLE001 - best effort at the end of a run
                log.warning("removing a placement group: %s", exc)
        self.groups = {}


def _nodes() -> tuple[list[dict], int]:
    """Each live node's resources, and how many nodes the head declared dead: lost, restarting, or cut off from the
    head for a while. One may join again (as a new node, with the resources it had); Ray keeps no record of a dead
    node's resources."""
    table = ray.nodes()
    return [n.get("Resources", {}) for n in table if n.get("Alive")], sum(1 for n in table if not n.get("Alive"))


def _cluster() -> tuple[dict, list[dict]]:
    """The cluster's total resources and each live node's."""
    return ray.cluster_resources(), _nodes()[0]


def _refusal(group: RoleGroup, why: str) -> PlacementError:
    total, nodes = _cluster()
    shown = {k: v for k, v in total.items() if not k.startswith(("node:", "memory", "object_store"))}
    return PlacementError(f"placement: the {group.role} group ({group.setting}) asks for bundles "
                          f"{list(group.bundles)} ({group.strategy}); {why}. The cluster has {shown} on "
                          f"{len(nodes)} node(s)")


def _fits_a_node(group: RoleGroup, nodes: list[dict]) -> bool:
    """Each bundle fits some node, and a STRICT_PACK group fits one node whole (a quick infeasibility check)."""
    def fits(need: dict, node: dict) -> bool:
        return all(node.get(name, 0.0) >= amount - 1e-9 for name, amount in need.items())

    if group.strategy == "STRICT_PACK":
        whole: dict[str, float] = {}
        for b in group.bundles:
            for name, amount in b.items():
                whole[name] = whole.get(name, 0.0) + amount
        return any(fits(whole, node) for node in nodes)
    return all(any(fits(b, node) for node in nodes) for b in group.bundles)


def reserve_placement(cfg: Config, timeout_s: float | None = None) -> Placement:
    """Make every placement group of the run and wait until each is placed; refuse (PlacementError, the groups
    made so far removed) one that no node could hold or that is not placed within timeout_s (default
    `ray.placement_timeout_s`). A group that no live node has room for while a node is out of the cluster (the head declared it
    dead: lost, restarting, cut off; Ray does not say which resources a dead node had, so any node away counts)
    is waited for like one whose resources other groups hold: a driver started or resumed while such a node is away
    places its actors when the node joins again."""
    from ray.util import placement_group

    timeout_s = cfg.ray.placement_timeout_s if timeout_s is None else timeout_s
    placement = Placement({})
    try:
        nodes, gone = _nodes()
        plan = placement_plan(cfg)
        away = set()
        for group in plan:
            if _fits_a_node(group, nodes):
                continue
            if not gone:
                raise _refusal(group, "no node of the cluster has room for " +
                               ("the whole group" if group.strategy == "STRICT_PACK" else "one of its bundles"))
            away.add(group.role)
        if away:
            log.warning("placement: no live node has room for the %s group(s) and %d node(s) are out of the cluster "
                        "(lost, restarting or cut off): waiting up to %gs (ray.placement_timeout_s) for one to join "
                        "again", ", ".join(sorted(away)), gone, timeout_s)
        for group in plan:
            placement.groups[group.role] = placement_group(list(group.bundles), strategy=group.strategy,
                                                           name=f"{cfg.run.name}-{group.role}")
        for group in plan:
            if not placement.groups[group.role].wait(timeout_s):
                why = ("no live node has room for it, and no node out of the cluster (lost, restarting or cut off) "
                       "joined again with room for it" if group.role in away else
                       "its free resources are held by the other groups or other runs")
                raise _refusal(group, f"the cluster did not place it within {timeout_s:g}s "
                                      f"(ray.placement_timeout_s; {why})")
    except BaseException:
        placement.remove()
        raise
    return placement


def check_fleet_config(cfg: Config) -> None:
    """Refuse, before any actor starts, a rollout layout that cannot work, naming the setting. (rollout.max_in_flight
    needs no check beyond >= 1: a step's request chunks are cut no larger than it, see
    pcl.engines.batching.request_chunks.)"""
    r = cfg.rollout
    gpus = r.num_gpus_per_worker
    if r.engine == "vllm" and gpus > 0 and (gpus != int(gpus) or int(gpus) % r.tensor_parallel_size):
        raise ConfigError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} does not divide the engine's GPUs "
                          f"(rollout.num_gpus_per_worker={gpus:g}): each vLLM engine shards the model over its "
                          f"worker's whole GPUs")


def _answers(refs: list, wait_s: float) -> list[bool]:
    """Per call: it answered True within wait_s (all of them waited for together)."""
    ready = set(ray.wait(refs, num_returns=len(refs), timeout=wait_s)[0]) if refs else set()
    out = []
    for ref in refs:
        try:
            out.append(ref in ready and bool(ray.get(ref)))
        except Exception:  # noqa: BLE001 - RayActorError and friends: lost
            out.append(False)
    return out


def start_fleet(cfg: Config, prep, redis_url: str, placement_timeout_s: float | None = None,
                kept: Fleet | None = None) -> Fleet:
    """Reserve the run's placement groups, start every actor in them and wait until each answers. With `kept`
    (`Fleet.salvage`), its placement groups and live actors are used and only the missing ones started."""
    check_fleet_config(cfg)
    placement = kept.placement if kept is not None else reserve_placement(cfg, placement_timeout_s)
    h = kept.handles if kept is not None else FleetHandles(
        redis_url, prep.policy_path, prep.value_path, verifiers=[None] * cfg.verifier.num_workers,
        rollout_workers=[None] * cfg.rollout.num_workers)  # _start_actors starts an actor for every None
    fleet = Fleet(None, h, placement)
    try:
        fleet.coordinator = _start_actors(cfg, prep, redis_url, placement, h)
    except BaseException:
        fleet.stop()
        raise
    return fleet


def _start_actors(cfg: Config, prep, redis_url: str, placement: Placement, h: FleetHandles):
    from actors.coordinator import Coordinator
    from actors.learner import LearnerGroup
    from actors.rollout import RolloutWorker
    from actors.sampler import PromptSamplerActor
    from actors.scorer import ValueScorerActor, restart_options
    from actors.verifier import RewardVerifier
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pcl.engines import max_model_len

    from services.incarnations import Registry

    seed, run = cfg.run.seed, cfg.run.name
    registry = Registry(redis_url, run)  # where each actor beats its heartbeat (services/incarnations.py)
    policy = cfg.model.model_copy(update={"path": prep.policy_path})  # the model section, with the local copy
    # The coordinator and the sampler live on the driver's node: they write the run directory beside the driver,
    # and losing them is losing the run's driver node anyway (the rest is placed by its placement groups).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    if h.sampler is None:
        h.sampler = PromptSamplerActor.options(scheduling_strategy=here).remote(prep.train_prompts, seed, registry)
    if "value" in placement.groups and h.scorer is None:  # the strategy needs V (pcl.tools.placement)
        gpus = cfg.learner.num_gpus_per_rank  # every V rank: one learner rank's GPUs
        h.scorer = ValueScorerActor.options(num_gpus=gpus, resources=cfg.value.resources or None,
                                            scheduling_strategy=placement.at("value", 0),
                                            **restart_options(cfg.rollout.deterministic)).remote(
            cfg.value, prep.value_path, "cuda" if gpus > 0 else "cpu", seed,
            checkpoints=str(prep.run_dir / "checkpoints"), num_gpus=gpus, timeout_s=cfg.learner.timeout_s,
            placement=placement.groups["value"], registry=registry,
            collective_timeout_s=cfg.learner.collective_timeout_s, ping_timeout_s=cfg.learner.ping_timeout_s)
    wait_while_full(lambda: publish_answers(redis_url, run, prep.answers), "the gold answers",  # one transaction
                    cfg.redis.full_timeout_s)
    kept_verifiers = [v for v in h.verifiers if v is not None]
    h.verifiers = [v if v is not None else RewardVerifier.options(resources=cfg.verifier.resources or None).remote(
        cfg.verifier, cfg.redis, cfg.run, redis_url, i) for i, v in enumerate(h.verifiers)]
    h.rollout_workers = [w if w is not None else RolloutWorker.options(
        num_gpus=cfg.rollout.num_gpus_per_worker, resources=cfg.rollout.resources or None,
        scheduling_strategy=placement.at(f"rollout-{i}")).remote(
            cfg.rollout, cfg.redis, cfg.run, policy, redis_url, i, max_model_len(cfg))
        for i, w in enumerate(h.rollout_workers)]
    if h.learners is None:
        h.learners = LearnerGroup.create(cfg.learner, cfg.optimizer, policy, seed,
                                         placement=placement.groups["learner"], registry=registry)
    # kept verifiers serve the purged streams from here on (kept rollout workers, once the restore's weights come)
    pings = [a.ping.remote() for a in [h.sampler, *h.verifiers, *h.rollout_workers, h.scorer] if a is not None]
    ray.get(pings + [v.resume.remote() for v in kept_verifiers], timeout=cfg.learner.timeout_s)
    return Coordinator.options(scheduling_strategy=here).remote(cfg.model_dump(), str(prep.run_dir), h,
                                                                prep.eval_prompts, prep.suite)
