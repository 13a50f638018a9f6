"""A frozen rollout worker's late results are never trained on, and are counted by the process that produced them.

A real Redis server, the coordinator's real RolloutClient, the real RolloutService and VerifierService serving
loops and the real RewardPool with math-verify. rollout-0 freezes in the middle of generating step 1 (its engine
blocks, as a node cut off or SIGSTOPped does); rollout-1 reclaims the request entry after its visibility timeout
and generates step 1, which commits. Then rollout-0 thaws and forwards its step-1 results, late: the verifier
scores them, and step 2's collector drops every one as stale, counted as rollout-0's, of this process's incarnation
(services/incarnations.py), in the coordinator's step-record counters."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

from pcl.config import load_config
from pcl.data.prompts import PromptRecord
from pcl.engines import Generation, RolloutRequest, SamplingParams
from pcl.reward.pool import RewardPool
from services.incarnations import INCARNATION
from services.streams.rollout_client import RolloutClient
from services.streams.topology import open_role
from services.streams.workers import RolloutService, VerifierService, serve_forever

pytestmark = pytest.mark.redis
N = 3
PROMPTS = {"a": (5, 6, 7), "b": (8, 9, 10)}
WAIT_S = 60.0


class GatedEngine:
    """Answers "2" to every prompt; while `gate` is closed, generate blocks (and says so with `entered`)."""

    policy_version = 0

    def __init__(self, open_: bool = True) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        if open_:
            self.gate.set()

    def generate(self, prompts, params):
        self.entered.set()
        self.gate.wait()
        return [[Generation(i, j, [4, 2], "2", "stop", 2) for j in range(params.n)] for i in range(len(prompts))]


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_S:g} s"
        time.sleep(0.01)


@contextmanager
def serving(services: dict):
    stop = threading.Event()
    threads = [threading.Thread(target=serve_forever, args=(service, stop, name), daemon=True)
               for name, service in services.items()]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def test_a_frozen_workers_late_results_are_dropped_as_stale_and_counted_by_their_producer(redis_url, redis_client,
                                                                                            key_prefix):
    run, opts = key_prefix, dict(block_ms=50)
    cfg = load_config(None, [f"run.name={run}", "rollout.step_timeout_s=120", "redis.block_ms=50"])
    coordinator = RolloutClient(cfg, redis_url)  # one chunk per step: rollout.num_workers = 1
    prompts = [PromptRecord(pid, "q", "2", "q", tokens) for pid, tokens in PROMPTS.items()]
    requests = RolloutRequest.for_prompts(prompts, SamplingParams(n=N))

    frozen, live = GatedEngine(open_=False), GatedEngine()
    queues = {name: open_role(redis_client, run, name.split("-")[0], name, **opts, visibility_timeout_s=vis)
              for name, vis in (("rollout-0", 600.0), ("rollout-1", 0.3), ("verifier-0", 600.0))}
    rollout = {name: RolloutService(engine, queues[name]["rollout_requests"], queues[name]["rollout_results"],
                                    worker=name) for name, engine in (("rollout-0", frozen), ("rollout-1", live))}
    with RewardPool(processes=1, timeout_s=30.0) as pool:
        verifier = VerifierService(pool, {pid: "2" for pid in PROMPTS}, queues["verifier-0"]["rollout_results"],
                                   queues["verifier-0"]["rewards"])
        with serving({"verifier-0": verifier, "rollout-0": rollout["rollout-0"]}):
            results: list = []
            step1 = threading.Thread(target=lambda: results.append(coordinator.generate_rollouts(1, 0, requests)))
            step1.start()
            assert frozen.entered.wait(WAIT_S), "rollout-0 never took step 1's requests"
            with serving({"rollout-1": rollout["rollout-1"]}):  # reclaims them after its 0.3 s visibility timeout
                step1.join(WAIT_S)
                assert results and len(results[0]) == len(PROMPTS) * N, "step 1 did not complete"
                assert coordinator.counters()["rollout_samples_by_worker"] == {"rollout-1": len(PROMPTS) * N}

                frozen.gate.set()  # rollout-0 thaws: its step-1 results go out after step 1 committed
                wait_for(lambda: rollout["rollout-0"].counts["samples"] == len(PROMPTS) * N, "rollout-0's results")
                wait_for(lambda: verifier.counts["verified"] == 2 * len(PROMPTS) * N, "the late results scored")
                step2 = coordinator.generate_rollouts(2, 0, requests)

    assert {s.prompt_id for s in step2} == set(PROMPTS) and len(step2) == len(PROMPTS) * N
    counters = coordinator.counters()
    assert counters["dropped_stale_step"] == len(PROMPTS) * N
    assert counters["dropped_stale_by_producer"] == {f"rollout-0@{INCARNATION}": len(PROMPTS) * N}
