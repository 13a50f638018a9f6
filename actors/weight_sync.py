"""The two routes of the learner's weights to the rollout fleet, behind one interface (`WeightSender`):

    sender = weight_sender(cfg, learners, workers)    # RpcWeights or CollectiveWeights, by rollout.weight_sync
    done = sender.sync(version, targets)               # those workers serve `version` from here on
    sender.reload(worker, version)                     # a worker Ray restarted gets the current weights

- `rpc` (`RpcWeights`): learner rank 0 gathers the full state into Ray's object store; every worker loads it
  (`RolloutWorker.load_weights`). Works with any engine; the weights pass through host memory. The sync goes to the
  workers it is given (the coordinator leaves out stragglers: services/streams/stragglers.py) and does not wait for
  a laggard: once some have loaded, one that has not within max(10 s, 3 x the slowest load) is left behind (its
  load stays queued) and gets the weights when it makes progress again.
- `collective` (`CollectiveWeights`): learner rank 0 and every vLLM worker form one torch.distributed group
  (`pcl.weight_sync.collective`: NCCL with GPUs, else gloo) and each step's weights are broadcast bucket by
  bucket into vLLM, from the learner's device as they are gathered (`pcl.weight_sync.stream`), leaving out the
  weights every engine ties to another (a tied `lm_head.weight`: the engines load the embedding for it).
  Ranks: learner rank 0 is 0; rollout worker i holds ranks 1 + i * tensor_parallel_size onwards (one per vLLM
  worker). A worker that Ray restarted is not in the group: it takes the weights by rpc,
  and the group re-forms with it at the next sync. The group needs every member: a frozen worker holds the broadcast
  until `learner.timeout_s` (then a restart from the checkpoint), stragglers or not.

A group that cannot form or a transfer that fails raises within the timeout (naming the address); the
coordinator's restart loop then takes over as for any failed step.
"""

from __future__ import annotations

import logging
from typing import Protocol

import ray

from actors.runtime import gather, gather_answered
from services.streams.stragglers import STRAGGLER_FACTOR, STRAGGLER_MIN_S

log = logging.getLogger("pcl.weight_sync")


class WeightSender(Protocol):
    def sync(self, version: int, targets: list[int]) -> set[int]:
        """Send the learner's weights as policy `version` to the rollout workers `targets` (indices); returns those
        that took them."""

    def reload(self, worker, version: int) -> None:
        """Give the current weights (`version`) to one worker that lacks them (Ray restarted it)."""


def laggard_wait(slowest_s: float) -> float:
    """How long a weight sync waits for a worker once others loaded in up to `slowest_s` seconds."""
    return max(STRAGGLER_MIN_S, STRAGGLER_FACTOR * slowest_s)


class RpcWeights:
    """Through the object store: one gather on learner rank 0, one load per worker."""

    def __init__(self, learners, workers: list, timeout_s: float) -> None:
        self.learners, self.workers, self.timeout_s = learners, workers, timeout_s
        self.ref = None  # the weights of the last sync in the object store

    def sync(self, version: int, targets: list[int]) -> set[int]:
        ref = self.learners.state_ref()
        loaded = gather_answered([self.workers[i].load_weights.remote(ref, version) for i in targets], self.timeout_s,
                                 "weight sync", laggard_wait)
        self.ref = ref
        left = [i for i, ok in zip(targets, loaded) if not ok]
        if left:
            log.warning("weight sync of version %d: rollout worker(s) %s did not load within the laggard wait: "
                        "left behind", version, left)
        return {i for i, ok in zip(targets, loaded) if ok}

    def reload(self, worker, version: int) -> None:
        if self.ref is None:
            self.ref = self.learners.state_ref()
        ray.get(worker.load_weights.remote(self.ref, version), timeout=self.timeout_s)


class CollectiveWeights:
    """A torch.distributed broadcast from learner rank 0 into every vLLM worker (see the module docstring)."""

    def __init__(self, learners, workers: list, rollout_cfg, backend: str, timeout_s: float) -> None:
        self.learners, self.workers, self.cfg = learners, workers, rollout_cfg
        self.backend, self.timeout_s = backend, timeout_s
        self.formed = False
        self.skip: tuple[str, ...] = ()  # weights every engine ties to another: not sent
        self.ref, self.ref_version = None, None  # weights put in the object store for restarted workers

    def form(self) -> None:
        """Learner rank 0 hosts the group at a port of its node it holds bound; every vLLM worker joins it (each
        member leaves a group it held from before: a failed one was aborted where the failure was seen)."""
        rank0 = self.learners.ranks[0]
        address = ray.get(rank0.weight_group_address.remote(), timeout=self.timeout_s)  # its port held bound
        tp = self.cfg.tensor_parallel_size
        world = 1 + tp * len(self.workers)
        join_timeout = min(self.timeout_s, 600.0)
        refs = [rank0.open_weight_group.remote(address, world, self.backend, join_timeout)]
        refs += [w.join_weight_group.remote(address, 1 + i * tp, world, self.backend, join_timeout)
                 for i, w in enumerate(self.workers)]
        gather(refs, self.timeout_s, f"weight-sync group at {address[0]}:{address[1]}")
        ties = gather([w.tied_weights.remote() for w in self.workers], self.timeout_s, "tied weights")
        self.skip = tuple(sorted(set.intersection(*(set(t) for t in ties)))) if ties else ()
        log.info("weight-sync group formed at %s:%s (%s, %d members; tied, not sent: %s)", *address, self.backend,
                 world, ", ".join(self.skip) or "none")
        self.formed = True

    def sync(self, version: int, targets: list[int]) -> set[int]:
        """Every worker, `targets` or not: the broadcast's group holds them all."""
        if not self.formed:
            self.form()
        refs = self.learners.broadcast_refs(self.cfg.weight_sync_bucket_mb << 20, self.skip)
        refs += [w.receive_weights.remote(version) for w in self.workers]
        try:
            gather(refs, self.timeout_s, "weight broadcast")
        except Exception:
            self.formed = False  # a member may be gone or out of step: re-form before the next broadcast
            raise
        return set(range(len(self.workers)))

    def reload(self, worker, version: int) -> None:
        """By rpc (the restarted worker is not in the group); the group re-forms with it at the next sync."""
        if self.ref_version != version:
            self.ref, self.ref_version = self.learners.state_ref(), version
        self.formed = False
        ray.get(worker.load_weights.remote(self.ref, version), timeout=self.timeout_s)


def weight_sender(cfg, learners, workers: list) -> WeightSender:
    """The route `rollout.weight_sync` names: collective (NCCL where learner and workers have GPUs, else gloo) or
    rpc."""
    if cfg.rollout.weight_sync == "collective":
        gpus = cfg.learner.num_gpus_per_rank > 0 and cfg.rollout.num_gpus_per_worker > 0
        return CollectiveWeights(learners, workers, cfg.rollout, "nccl" if gpus else "gloo", cfg.learner.timeout_s)
    return RpcWeights(learners, workers, cfg.learner.timeout_s)
