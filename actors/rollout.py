"""RolloutWorker actor: one member of the rollout fleet (algorithm step 4).

It serves the request stream in a background thread with a generation engine (HF on CPU, vLLM on GPU) and
takes versioned weights from the learner between steps. All logic is in `services.streams.workers.RolloutService`.

Ray restarts a worker whose process dies (or whose node is lost). A worker whose engine dies (vLLM's engine
process on GPU: out of memory, an NCCL abort) ends its own process, engine processes included, so that Ray
restarts it with a fresh engine (`actors.engine_processes`); a worker killed outright leaves its engine's
processes behind, and its next incarnation ends them before it builds its engine (they hold the GPU's memory). The restarted worker holds the initial
weights (version 0) and takes no request until the coordinator, which checks the fleet's versions while it
waits for a step's samples, gives it the current weights (or, at version 0, tells it to serve): a request it
took and handed back would count as a delivery each time, and be dead-lettered after `redis.max_deliveries`
before the weights arrive. The requests its previous process held are reclaimed from the stream after the
visibility timeout.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import ray

from actors.engine_processes import end_process, reap_engine_processes, record_engine_processes
from actors.runtime import ServingThread, init_actor_process

if TYPE_CHECKING:
    from pcl.config import ModelConfig, RedisConfig, RolloutConfig, RunConfig


def _restarted() -> bool:
    """Whether Ray restarted this actor (its accessor reads a deprecated property inside: silenced)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class RolloutWorker:
    def __init__(self, cfg: RolloutConfig, redis: RedisConfig, run: RunConfig, model: ModelConfig, redis_url: str,
                 worker_id: int, max_model_len: int | None = None):
        """cfg: the `rollout` section; redis: the `redis` section (queue settings); run: the `run` section (name,
        seed); model: the `model` section with `path` the local policy directory to load; max_model_len: vLLM's
        context length (prompt + response, `pcl.engines.max_model_len`)."""
        init_actor_process(cfg.threads)
        self.name = name = f"rollout-{worker_id}"
        reap_engine_processes(run.name, name)  # an engine process its previous incarnation left (killed actor)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM's start-up INFO lines, once per worker
        from pcl.engines import make_engine
        from pcl.engines.pinned import PinnedEngine
        from services.redis_server import make_client
        from services.streams.topology import open_role
        from pcl.engines.base import engine_dead
        from services.streams.workers import RolloutService

        device = "cuda" if cfg.num_gpus_per_worker > 0 else "cpu"
        extra = {"max_model_len": max_model_len} if cfg.engine == "vllm" else {}
        # Built, generating and loading weights on one thread: one OpenMP team (see pcl.engines.pinned).
        engine = PinnedEngine(lambda: make_engine(cfg, model.path, run.seed + 1000 * worker_id, dtype=model.dtype,
                                                  device=device, **extra))
        record_engine_processes(run.name, name)
        queues = open_role(make_client(redis_url, name), run.name, "rollout", name, redis,
                           max_in_flight=cfg.max_in_flight)
        requests, results = queues["rollout_requests"], queues["rollout_results"]
        self.service = RolloutService(engine, requests, results, batch_requests=cfg.max_in_flight, worker=name)
        self.loop = ServingThread(self.service, name, fatal=lambda exc: engine_dead(exc) or not engine.alive(),
                                  on_fatal=end_process)
        if not _restarted():
            self.loop.start()  # a restarted worker starts serving when it is given weights (`serve`)

    def load_weights(self, weights: dict, version: int) -> dict[str, float]:
        """Install the learner's weights as policy `version` (and serve, if not yet); returns how long it took."""
        start = time.perf_counter()
        self.service.load_weights(weights, version)
        self.serve()
        return {"version": version, "seconds": time.perf_counter() - start}

    def join_weight_group(self, address: tuple[str, int], rank_offset: int, world_size: int, backend: str,
                          timeout_s: float) -> list[int]:
        """vLLM: join learner rank 0's weight-sync group (`rollout.weight_sync: collective`); returns the ranks."""
        with self.service.lock:
            return self.service.engine.join_weight_group(address[0], address[1], rank_offset, world_size, backend,
                                                         timeout_s)

    def tied_weights(self) -> dict[str, str]:
        """vLLM: {name: the name it is tied to} of the weights its model shares (a collective sync skips them)."""
        with self.service.lock:
            return self.service.engine.tied_weights()

    def receive_weights(self, version: int) -> dict[str, float]:
        """vLLM: take policy `version` from learner rank 0's broadcast (and serve, if not yet)."""
        start = time.perf_counter()
        with self.service.lock:
            self.service.engine.receive_weights(version)
        self.serve()
        return {"version": version, "seconds": time.perf_counter() - start}

    def serve(self) -> None:
        """Start serving the request stream with the weights held, if not serving yet (after a restart)."""
        self.loop.start()

    def stats(self) -> dict[str, Any]:
        return {"policy_version": self.service.engine.policy_version, **self.service.counts}

    def policy_version(self) -> int:
        """The policy version it serves; -1 for a restarted worker that serves nothing yet."""
        return self.service.engine.policy_version if self.loop.started else -1

    def rng_state(self) -> dict[str, int]:
        """The engine's sampling state (its count of unseeded generation calls), for checkpoints."""
        return {"calls": int(getattr(self.service.engine, "_calls", 0))}

    def load_rng_state(self, state: dict[str, int]) -> None:
        with self.service.lock:
            if hasattr(self.service.engine, "_calls"):
                self.service.engine._calls = int(state["calls"])

    def quiesce(self, wait_s: float = 15.0) -> bool:
        """Before a restart of the run from a checkpoint that keeps this worker: stop serving (the pass under way
        ends first, forwarding what it took); it serves again when the restore gives it weights, as a worker
        Ray restarted does. False if the serving loop did not stop within wait_s (then it is not kept)."""
        return self.loop.quiesce(wait_s)

    def shutdown(self) -> None:
        self.loop.shutdown()

    def ping(self) -> bool:
        """The serving thread runs (or, after a restart, waits to be started)."""
        return self.loop.alive() or not self.loop.started
