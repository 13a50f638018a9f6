"""The learner group: M Ray actors forming one torch.distributed process group over an FSDP2 policy.

    group = LearnerGroup.create(cfg.learner, cfg.optimizer, policy, seed)   # policy: the model section, local path
    stats = group.train(sequences, global_count)       # exactly one optimizer step (algorithm step 7)
    ref = group.state_ref()                           # full weights of rank 0, in the object store

Each rank runs `pcl.models.learner.PolicyLearner`; this file only places the ranks, wires the process group
(gloo on CPU, NCCL on GPU) and fans a step's shards out to them.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any, Sequence

import ray

from actors.runtime import gather, heartbeat, in_bundle, init_actor_process
from pcl.loop.batch import shard_sequences

if TYPE_CHECKING:
    from pcl.config import LearnerConfig, ModelConfig, OptimizerConfig


class LearnerLost(RuntimeError):
    """A learner rank died: the process group is broken and the run restarts from its last checkpoint."""


@ray.remote(num_cpus=0, max_restarts=0)
class LearnerRank:
    def __init__(self, rank: int, world_size: int, threads: int = 1, registry=None):
        """registry: where the run's actors beat their heartbeats (`services.incarnations.Registry`), or None."""
        init_actor_process(threads)
        self.rank, self.world_size = rank, world_size
        self.learner = None
        self.heartbeat = heartbeat(registry, "learner", f"learner-{rank}")

    def address(self) -> tuple[str, int]:
        """An address and free port on this node for the process group's rendezvous (asked of rank 0)."""
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            return host, s.getsockname()[1]

    def setup(self, master: tuple[str, int], backend: str, cfg: LearnerConfig, optimizer: OptimizerConfig,
              model: ModelConfig, seed: int) -> bool:
        """Join the process group (backend resolved by the group) and build this rank's share of the policy at
        model.path, with the `learner` and `optimizer` sections."""
        from pcl.models.learner import init_process_group, learner_for_run

        init_process_group(backend, f"tcp://{master[0]}:{master[1]}", self.rank, self.world_size,
                           timeout_s=cfg.collective_timeout_s)
        device = "cuda" if cfg.num_gpus_per_rank > 0 else "cpu"
        self.learner = learner_for_run(cfg, optimizer, model, seed, device, self.rank, self.world_size)
        return True

    def train_step(self, shard: list[dict], global_count: int) -> dict[str, float]:
        return self.learner.train_step(shard, global_count)

    def full_state_dict(self) -> dict:
        return self.learner.full_state_dict()

    def weight_group_address(self) -> tuple[str, int]:
        """Rank 0: the weight-sync group's rendezvous address, its port held bound until the group forms on it."""
        from pcl.weight_sync.collective import reserve_port

        self.weight_listener = reserve_port()
        return ray.util.get_node_ip_address(), self.weight_listener.getsockname()[1]

    def open_weight_group(self, address: tuple[str, int], world_size: int, backend: str, timeout_s: float) -> bool:
        """Rank 0: host the weight-sync group with the vLLM workers (`rollout.weight_sync: collective`) on the
        socket `weight_group_address` reserved; a group held from before is closed first."""
        from pcl.weight_sync.collective import WeightGroup

        if getattr(self, "weight_group", None) is not None:
            self.weight_group.close()
        device = "cuda" if backend == "nccl" else "cpu"
        self.weight_group = WeightGroup.open(address[0], address[1], 0, world_size, backend, timeout_s, device,
                                             listen_socket=getattr(self, "weight_listener", None))
        self.weight_listener = None
        return True

    def broadcast_weights(self, bucket_bytes: int, skip: Sequence[str] = ()) -> int:
        """All ranks gather the weights bucket by bucket (a collective); rank 0 broadcasts each bucket to the vLLM
        workers from its device as it is gathered, leaving out `skip` (weights the engines tie to others)."""
        from pcl.weight_sync.stream import send_weights

        return send_weights(self.learner, self.weight_group if self.rank == 0 else None, bucket_bytes, skip)

    def state_dict(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)

    def save_pretrained(self, path: str) -> None:
        self.learner.save_pretrained(path)

    def save_checkpoint(self, directory: str) -> None:
        self.learner.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.learner.load_checkpoint(directory)

    def ping(self) -> bool:
        return True


class LearnerGroup:
    """Driver-side handle on the M learner ranks; every call reaches all ranks (they share collectives)."""

    def __init__(self, ranks: list, timeout_s: float, ping_timeout_s: float = 10.0):
        self.ranks, self.timeout_s, self.ping_timeout_s = ranks, timeout_s, ping_timeout_s

    @classmethod
    def create(cls, cfg: LearnerConfig, optimizer: OptimizerConfig, model: ModelConfig, seed: int,
               placement=None, registry=None) -> "LearnerGroup":
        """cfg.num_ranks ranks placed by the `learner` section (GPUs, resources), rank r in bundle r of the
        placement group `placement` when given, each training the policy at model.path (a local directory) in
        model.dtype with the `optimizer` section, and beating its heartbeat in `registry` when given."""
        ranks = [LearnerRank.options(num_gpus=cfg.num_gpus_per_rank, resources=cfg.resources or None,
                                     **in_bundle(placement, r)).remote(r, cfg.num_ranks, registry=registry)
                 for r in range(cfg.num_ranks)]
        master = ray.get(ranks[0].address.remote(), timeout=cfg.timeout_s)
        backend = cfg.backend
        if backend == "auto":
            backend = "nccl" if cfg.num_gpus_per_rank > 0 else "gloo"
        gather([r.setup.remote(master, backend, cfg, optimizer, model, seed) for r in ranks], cfg.timeout_s,
               "learner set-up")
        return cls(ranks, cfg.timeout_s, cfg.ping_timeout_s)

    def train(self, sequences: Sequence[dict], global_count: int) -> dict[str, float]:
        """One optimizer step over the whole batch; returns rank 0's stats with the step's wall time."""
        start = time.perf_counter()
        shards = shard_sequences(sequences, len(self.ranks))
        stats = self._gather([r.train_step.remote(s, global_count) for r, s in zip(self.ranks, shards)],
                             "learner step")
        out = dict(stats[0])
        out["num_tokens"] = float(sum(s.get("num_tokens", 0) for s in stats))
        out["learner_wall_seconds"] = time.perf_counter() - start
        return out

    def state_ref(self):
        """ObjectRef of the full (gathered) policy weights, from rank 0; all ranks join the gather."""
        refs = [r.full_state_dict.remote() for r in self.ranks]
        self._gather(refs[1:], "weight gather")  # the other ranks return {}; rank 0's is the weights
        ray.wait(refs[:1], timeout=self.timeout_s)
        return refs[0]

    def broadcast_refs(self, bucket_bytes: int, skip: Sequence[str] = ()) -> list:
        """Start a weight broadcast from rank 0 (the other ranks join its gathers), leaving out `skip`; the caller
        gathers the refs together with the receivers' (`rollout.weight_sync: collective`)."""
        return [r.broadcast_weights.remote(bucket_bytes, tuple(skip)) for r in self.ranks]

    def call_all(self, method: str, *args) -> list:
        return self._gather([getattr(r, method).remote(*args) for r in self.ranks], f"learner {method}")

    def _gather(self, refs: list, what: str) -> list:
        """All ranks' answers; when a call fails and a rank is gone, LearnerLost (the group cannot go on: its
        process group lost a member) rather than whatever error the surviving ranks' collectives raised."""
        try:
            return gather(refs, self.timeout_s, what)
        except Exception as exc:
            dead = self.dead_ranks()
            if dead:
                raise LearnerLost(f"{what}: learner rank(s) {dead} died; the group must restart") from exc
            raise

    def dead_ranks(self, timeout_s: float | None = None) -> list[int]:
        """The ranks that do not answer a ping within timeout_s (learner.ping_timeout_s), or whose call fails."""
        pings = [r.ping.remote() for r in self.ranks]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s or self.ping_timeout_s)
        dead = []
        for i, ref in enumerate(pings):
            try:
                if ref not in ready or not ray.get(ref):
                    dead.append(i)
            except ray.exceptions.RayError:
                dead.append(i)
        return dead

    def save_checkpoint(self, directory: str) -> None:
        """Write the policy (Hugging Face format), optimizer and RNG states into a checkpoint directory."""
        self.call_all("save_checkpoint", directory)

    def load_checkpoint(self, directory: str) -> None:
        self.call_all("load_checkpoint", directory)

    def kill(self) -> None:
        for r in self.ranks:
            ray.kill(r, no_restart=True)
