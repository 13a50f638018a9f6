"""RewardVerifier actor: scores rollout results with math-verify (algorithm step 5).

A background thread serves the result stream through `services.streams.workers.VerifierService`, which runs
math-verify in a spawn-based process pool with a hard per-sample timeout, so no model output can hang it.
Ray restarts a verifier whose process dies; what it held unacknowledged is reclaimed from the stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

from actors.runtime import ServingThread, init_actor_process

if TYPE_CHECKING:
    from pcl.config import RedisConfig, RunConfig, VerifierConfig


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class RewardVerifier:
    def __init__(self, cfg: VerifierConfig, redis: RedisConfig, run: RunConfig, redis_url: str, worker_id: int,
                 answers: dict | None = None):
        """cfg: the `verifier` section; redis: the `redis` section (queue settings); run: the `run` section (its
        name keys the streams). answers: gold answer by prompt id; None reads the run's answers from Redis
        (`services.streams.rollout_client.publish_answers`), which is how the fleet starts them: a restarted verifier finds
        them there whatever became of its creator."""
        init_actor_process(1)
        from pcl.reward.pool import RewardPool
        from services.redis_server import make_client
        from services.streams.rollout_client import read_answers
        from services.streams.topology import open_role
        from services.streams.workers import VerifierService

        self.pool = RewardPool(processes=cfg.processes, timeout_s=cfg.timeout_s,
                               max_tasks_per_worker=cfg.max_tasks_per_worker)
        name = f"verifier-{worker_id}"
        client = make_client(redis_url, name)
        if answers is None:
            answers = read_answers(client, run.name)
        queues = open_role(client, run.name, "verifier", name, redis)
        results, rewards = queues["rollout_results"], queues["rewards"]
        self.service = VerifierService(self.pool, answers, results, rewards, verifier=name)
        self.loop = ServingThread(self.service, name)
        self.loop.start()

    def stats(self) -> dict[str, Any]:
        return {**self.service.counts, **{f"pool_{key}": value for key, value in self.pool.stats().items()}}

    def quiesce(self, wait_s: float = 15.0) -> bool:
        """Before a restart of the run from a checkpoint that keeps this verifier: stop serving (the pass under
        way ends first); `resume` starts it again on the purged streams. False if it did not stop within wait_s."""
        return self.loop.quiesce(wait_s)

    def resume(self) -> bool:
        self.loop.start()
        return True

    def shutdown(self) -> None:
        self.loop.shutdown()
        self.pool.close()

    def ping(self) -> bool:
        return self.loop.alive()
