"""Bad numbers from an engine are refused at the wire, and a request refused twice stops the run by name.

A real Redis server, the coordinator's real RolloutClient, the real RolloutService and VerifierService serving loops
and the real spawn-based RewardPool with math-verify. The engine is a stand-in that answers every prompt with "2"
and reports, for prompt "bad", a NaN log-probability on one token of sample 1: always (a deterministic engine, which
gives a retried request the same output), or only the first time (a sampling engine, which draws new samples).
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import pytest

from entrypoints.train import recoverable
from pcl.config import load_config
from pcl.data.prompts import PromptRecord
from pcl.engines import Generation, RolloutRequest, SamplingParams
from pcl.reward.pool import RewardPool
from services.streams.refusals import RefusedTwice
from services.streams.rollout_client import RolloutClient
from services.streams.topology import open_role
from services.streams.workers import RolloutService, VerifierService, serve_forever

pytestmark = pytest.mark.redis
N = 3
PROMPTS = {"good": (5, 6, 7), "bad": (8, 9, 10)}


class PoisonedEngine:
    """Answers "2" (tokens [4, 2]); sample 1 of prompt "bad" gets a NaN log-probability on its second token, on
    every call (`times=None`) or on the first `times` calls that generate it."""

    policy_version = 0

    def __init__(self, times: int | None) -> None:
        self.times, self.poisoned = times, 0
        self.bad_calls = 0  # generate calls that held prompt "bad"

    def generate(self, prompts, params):
        out = []
        for index, prompt in enumerate(prompts):
            bad = tuple(prompt) == PROMPTS["bad"]
            self.bad_calls += bad
            poison = bad and (self.times is None or self.poisoned < self.times)
            self.poisoned += poison
            out.append([Generation(index, j, [4, 2], "2", "stop", 2,
                                   logprobs=[-0.5, math.nan if poison and j == 1 else -0.25])
                        for j in range(params.n)])
        return out


@pytest.fixture(scope="module")
def pool():
    with RewardPool(processes=1, timeout_s=30.0) as reward_pool:
        assert reward_pool.wait_ready(120)
        yield reward_pool


@contextmanager
def fleet(client, run: str, engine: PoisonedEngine, pool: RewardPool):
    """A rollout worker and a verifier serving the run's streams in threads."""
    stop = threading.Event()
    opts = dict(visibility_timeout_s=5.0, block_ms=50)
    rollout = open_role(client, run, "rollout", "rollout-0", **opts)
    verify = open_role(client, run, "verifier", "verifier-0", **opts)
    services = {"rollout-0": RolloutService(engine, rollout["rollout_requests"], rollout["rollout_results"]),
                "verifier-0": VerifierService(pool, {pid: "2" for pid in PROMPTS}, verify["rollout_results"],
                                              verify["rewards"])}
    threads = [threading.Thread(target=serve_forever, args=(service, stop, name), daemon=True)
               for name, service in services.items()]
    for thread in threads:
        thread.start()
    try:
        yield verify["rollout_results"]
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def client_for(redis_url: str, run: str, deterministic: bool) -> RolloutClient:
    cfg = load_config(None, [f"run.name={run}", f"rollout.deterministic={str(deterministic).lower()}",
                             "rollout.step_timeout_s=120", "redis.block_ms=50"])
    return RolloutClient(cfg, redis_url)


def requests() -> list[RolloutRequest]:
    records = [PromptRecord(pid, "q", "2", "q", tokens) for pid, tokens in PROMPTS.items()]
    return RolloutRequest.for_prompts(records, SamplingParams(n=N))


def test_a_request_refused_twice_for_a_nan_logprob_stops_the_run_naming_it(redis_url, redis_client, key_prefix,
                                                                           pool):
    """Deterministic engine: the output is dead-lettered, asked for again, dead-lettered again, and the call raises
    RefusedTwice naming the request and the cause within seconds, not after rollout.step_timeout_s; the driver does
    not restart the run for it (a restart would generate the same output)."""
    coordinator = client_for(redis_url, key_prefix, deterministic=True)
    engine = PoisonedEngine(times=None)
    with fleet(redis_client, key_prefix, engine, pool) as results:
        with pytest.raises(RefusedTwice) as refused:
            coordinator.generate_rollouts(2, 0, requests())
        letters = results.dead_letters()
    message = str(refused.value)
    assert (f"step 2: the output of request 'bad' (run '{key_prefix}', samples 0-2, policy version 0) was refused at "
            f"the wire twice") in message
    assert "sample 1 (policy version 0): engine log-probability nan at response token 1" in message
    assert f"{key_prefix}:rollout_results:dead" in message
    assert engine.bad_calls == 2 and len(letters) == 2 and coordinator.counters()["dead_letters"] == 2
    assert not recoverable(refused.value)


def test_a_request_refused_once_is_asked_for_again_and_its_new_output_collected(redis_url, redis_client, key_prefix,
                                                                                pool):
    """Sampling engine: the retry's output is finite, so the step gets all its samples (none from the refused
    output), and the refusal is counted as a dead letter."""
    coordinator = client_for(redis_url, key_prefix, deterministic=False)
    engine = PoisonedEngine(times=1)
    with fleet(redis_client, key_prefix, engine, pool):
        samples = coordinator.generate_rollouts(0, 0, requests())
    assert sorted((s.prompt_id, s.sample_index) for s in samples) == [(p, j) for p in ("bad", "good") for j in range(N)]
    assert all(s.reward == 1.0 and all(math.isfinite(x) for x in s.response_logprobs) for s in samples)
    assert engine.bad_calls == 2 and coordinator.counters()["dead_letters"] == 1
