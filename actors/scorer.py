"""ValueScorer actor: the value model V (algorithm steps 2 and 8), over `value.num_ranks` processes.

Scores the k*m candidates each step in batches (prompt-only forward pass) and trains on the m selected
prompts' realised pass rates once their rewards are in, with its own optimizer. With one rank it is a thin
wrapper over `pcl.models.value.ValueTrainer`; with N > 1 this actor is rank 0 of an FSDP2 group
(`pcl.models.value_sharded.ShardedValueTrainer`) and starts the N-1 other ranks (`ValueRank`, each with the same GPUs
and resources). It splits each call's prompts into N shares and runs its own share while the others run theirs:
scoring is local to each rank (its scoring copy), a training step is collective.

Ray restarts it when its process dies; the restarted scorer takes V (weights, optimizer, RNG) from the run's
newest complete checkpoint, so V loses at most the steps since then, and the call in flight is retried. The
other ranks belong to it: when one of them is lost mid-call, this actor ends its own process, so that the
whole group restarts that way. With deterministic rollouts (`rollout.deterministic`) it is not restarted in place
(`restart_options`): V as of a checkpoint is not the V an uninterrupted run has at that step, so its selections,
and the final weights, would differ. There a lost V process fails the call, and the driver restarts the whole run
from its newest checkpoint (as for a lost learner rank), which resumes exactly.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Sequence

import numpy as np
import ray

from actors.runtime import gather, heartbeat, in_bundle, init_actor_process
from pcl.checkpoint_store import latest
from pcl.config import ValueModelConfig
from pcl.engines.base import check_prompts
from pcl.models.value import value_step_figures
from pcl.models.value_sharded import build_value_trainer

log = logging.getLogger(__name__)


def restart_options(deterministic: bool) -> dict[str, int]:
    """The ValueScorerActor's Ray restart options: restarted in place by Ray (V from the newest checkpoint, the
    call retried), or with deterministic rollouts never (the call fails with RayActorError: the driver restarts
    the run from its checkpoint, `entrypoints.train.recoverable`)."""
    return {"max_restarts": 0, "max_task_retries": 0} if deterministic else {"max_restarts": -1, "max_task_retries": -1}


def _shares(items: Sequence, parts: int) -> list[list]:
    """`items` in `parts` contiguous runs of near-equal length (the first ones longer by at most one)."""
    bounds = np.linspace(0, len(items), parts + 1).round().astype(int)
    return [list(items[bounds[i]:bounds[i + 1]]) for i in range(parts)]


@ray.remote(num_cpus=0, max_restarts=0)
class ValueRank:
    """Rank r >= 1 of a sharded V; started, called and owned by the ValueScorerActor (rank 0)."""

    def __init__(self, threads: int = 1, registry=None, rank: int = 1):
        init_actor_process(threads)
        self.trainer = None
        self.heartbeat = heartbeat(registry, "scorer", f"scorer-{rank}")

    def setup(self, cfg: ValueModelConfig, model_path: str, device: str, seed: int, rank: int, world_size: int,
              master: tuple[str, int], collective_timeout_s: float) -> bool:
        self.trainer = build_value_trainer(cfg, model_path, device, seed, rank, world_size, master,
                                           collective_timeout_s)
        return True

    def call(self, method: str, *args) -> Any:
        return getattr(self.trainer, method)(*args)

    def ping(self) -> bool:
        return True


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class ValueScorerActor:
    def __init__(self, cfg: ValueModelConfig, model_path: str, device: str, seed: int, threads: int = 1,
                 checkpoints: str | None = None, num_gpus: float = 0.0, timeout_s: float = 1800.0,
                 placement=None, registry=None, collective_timeout_s: float = 1800.0, ping_timeout_s: float = 10.0):
        """placement: V's placement group (this actor in bundle 0, rank r in bundle r), or None; registry: where
        the run's actors beat their heartbeats (`services.incarnations.Registry`), or None; timeout_s: the
        deadline of a call to the other ranks, collective_timeout_s their process group's (learner.timeout_s and
        learner.collective_timeout_s); ping_timeout_s: after a failed call, a rank silent this long is lost."""
        init_actor_process(threads)
        self.heartbeat = heartbeat(registry, "scorer", "scorer-0")
        self.timeout_s, self.ping_timeout_s, world_size = timeout_s, ping_timeout_s, cfg.num_ranks
        self.peers = [ValueRank.options(num_gpus=num_gpus, resources=cfg.resources or None,
                                        **in_bundle(placement, r)).remote(threads, registry, r)
                      for r in range(1, world_size)]
        master = None
        if self.peers:
            with socket.socket() as s:  # rank 0 (this process) hosts the process group's rendezvous
                s.bind(("", 0))
                master = (ray.util.get_node_ip_address(), s.getsockname()[1])
        setups = [p.setup.remote(cfg, model_path, device, seed, r, world_size, master, collective_timeout_s)
                  for r, p in enumerate(self.peers, start=1)]
        self.trainer = build_value_trainer(cfg, model_path, device, seed, 0, world_size, master,
                                           collective_timeout_s)
        gather(setups, timeout_s, "value rank set-up")
        self.restored_from = None
        if checkpoints:  # a restart (or a resumed run's start): V as of the newest checkpoint
            found = latest(checkpoints)
            if found is not None and (found / "value").is_dir():
                self.load_checkpoint(str(found / "value"))
                self.restored_from = str(found)

    def _all(self, method: str, mine: tuple, theirs: list[tuple]) -> tuple[Any, list]:
        """`method` on every rank: the other ranks' calls first (collectives need them), then this rank's."""
        refs = [p.call.remote(method, *args) for p, args in zip(self.peers, theirs)]
        try:
            own = getattr(self.trainer, method)(*mine)
            return own, gather(refs, self.timeout_s, f"value {method}")
        except Exception:
            if self._lost_peers():
                log.error("value %s: a value rank was lost; ending the value group (restarted from its checkpoint, "
                          "in place or, with deterministic rollouts, with the whole run)", method)
                os._exit(1)  # Ray restarts this actor (and the group) and retries the call, unless restart_options
            raise

    def _lost_peers(self) -> bool:
        pings = [p.ping.remote() for p in self.peers]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=self.ping_timeout_s)
        try:
            return len(ready) < len(pings) or not all(ray.get(ready))
        except ray.exceptions.RayError:
            return True

    def score(self, prompt_token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """[len(prompts)] predicted pass rates in [0, 1]; each rank scores a contiguous share."""
        prompts = [list(p) for p in prompt_token_ids]
        check_prompts(prompts, self.trainer.model.vocab_size)  # here, so a message's index is the caller's
        shares = _shares(prompts, 1 + len(self.peers))
        own, theirs = self._all("score", (shares[0],), [(s,) for s in shares[1:]])
        return np.concatenate([own, *theirs]) if theirs else own

    def train(self, prompt_token_ids: Sequence[Sequence[int]], pass_rates: Sequence[float]) -> dict[str, float]:
        """One optimizer step on sum_i (V(x_i) - p_i)^2 over the selected prompts."""
        start = time.perf_counter()
        parts, prompts = 1 + len(self.peers), [list(p) for p in prompt_token_ids]
        if parts > 1:  # checked whole here, so that a message names the caller's index and no rank starts
            self.trainer._check_targets(prompts, pass_rates)
        prompts, rates = _shares(prompts, parts), _shares(np.asarray(pass_rates, dtype=np.float64), parts)
        stats, _ = self._all("train_step", (prompts[0], rates[0]), list(zip(prompts[1:], rates[1:])))
        return value_step_figures(stats, time.perf_counter() - start)

    def state_dict(self) -> dict[str, Any]:
        return self._all("state_dict", (), [()] * len(self.peers))[0]

    def save_checkpoint(self, directory: str) -> None:
        self._all("save_checkpoint", (directory,), [(directory,)] * len(self.peers))

    def load_checkpoint(self, directory: str) -> None:
        self._all("load_checkpoint", (directory,), [(directory,)] * len(self.peers))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._all("load_state_dict", (state,), [({},)] * len(self.peers))

    def ping(self) -> bool:
        return True
