"""The coordinator's collective weight sync (`rollout.weight_sync: collective`): learner rank 0 and every vLLM
worker of the fleet in one torch.distributed group (`pcl.weight_sync.collective`), each step's weights broadcast into vLLM.

    broadcast = WeightBroadcast(learners, workers, cfg.rollout, backend="gloo", timeout_s=600)
    broadcast.sync(version)      # forms the group on first use (or after invalidate), then one broadcast
    broadcast.invalidate()       # a rollout worker was restarted: it is not in the group; re-form at the next sync

Ranks: learner rank 0 is 0; rollout worker i holds ranks 1 + i * tensor_parallel_size onwards (one per vLLM
worker). A group that cannot form or a broadcast that fails raises (naming the address) within the timeout; the
coordinator's restart loop then takes over as for any failed step.
"""

from __future__ import annotations

import logging

from actors.runtime import gather

log = logging.getLogger("pcl.weight_sync.collective")


class WeightBroadcast:
    def __init__(self, learners, workers: list, rollout_cfg, backend: str, timeout_s: float) -> None:
        self.learners, self.workers, self.cfg = learners, workers, rollout_cfg
        self.backend, self.timeout_s = backend, timeout_s
        self.formed = False

    def form(self) -> None:
        """Learner rank 0 hosts the group at a port of its node it holds bound; every vLLM worker joins it (each
        member leaves a group it held from before: a failed one was aborted where the failure was seen)."""
        import ray

        rank0 = self.learners.ranks[0]
        address = ray.get(rank0.weight_group_address.remote(), timeout=self.timeout_s)  # its port held bound
        tp = self.cfg.tensor_parallel_size
        world = 1 + tp * len(self.workers)
        join_timeout = min(self.timeout_s, 600.0)
        refs = [rank0.open_weight_group.remote(address, world, self.backend, join_timeout)]
        refs += [w.join_weight_group.remote(address, 1 + i * tp, world, self.backend, join_timeout)
                 for i, w in enumerate(self.workers)]
        gather(refs, self.timeout_s, f"weight-sync group at {address[0]}:{address[1]}")
        log.info("weight-sync group formed at %s:%s (%s, %d members)", *address, self.backend, world)
        self.formed = True

    def sync(self, version: int) -> None:
        """Broadcast the learner's weights as policy `version` to every worker (forming the group if needed)."""
        if not self.formed:
            self.form()
        refs = self.learners.broadcast_refs(self.cfg.weight_sync_bucket_mb << 20)
        refs += [w.receive_weights.remote(version) for w in self.workers]
        try:
            gather(refs, self.timeout_s, "weight broadcast")
        except Exception:
            self.formed = False  # a member may be gone or out of step: re-form before the next broadcast
            raise

    def invalidate(self) -> None:
        self.formed = False
