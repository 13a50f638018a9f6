"""Verifier errors in a step: carried on each reward, counted, exported as pcl_verifier_errors_total, and a step
with more than verifier.max_error_share of them fails instead of training on their zeros.

A real Redis server, the coordinator's real RolloutClient, the real VerifierService serving loop over the real
spawn-based RewardPool with math-verify; generation is the deterministic stand-in of `tests.services.pipeline`
(sample j's response is "j+j=2j"), and the verifier's score function raises MemoryError, on every worker, for
the response of sample 2 of each prompt: with n = 4, a quarter of a prompt's rewards are errors.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest

from pcl.config import load_config
from pcl.data.prompts import PromptRecord
from pcl.engines import RolloutRequest, SamplingParams
from pcl.reward.pool import RewardPool, math_score
from services.streams.rollout_client import RolloutClient
from services.control.metrics import metrics_registry
from services.streams.topology import open_role
from services.control.run import RunControl
from services.streams.workers import VerifierService, serve_forever
from tests.services.control_fixtures import step_record, store  # noqa: F401 - fixture
from tests.services.pipeline import Streams

pytestmark = pytest.mark.redis
N = 4


def sample_2_fails(response, golds):
    if response.startswith("2+"):
        raise MemoryError("cannot allocate memory")
    return math_score(response, golds)


@pytest.fixture(scope="module")
def pool():
    with RewardPool(processes=2, timeout_s=30.0, score_fn=sample_2_fails) as reward_pool:
        assert reward_pool.wait_ready(120)
        yield reward_pool


@contextmanager
def fleet(client, run: str, pool: RewardPool, answers: dict):
    """A rollout stand-in and a real verifier serving the run's streams in threads."""
    stop = threading.Event()
    rollout = Streams.open(client, run, "rollout-0", block_ms=50)
    opts = dict(visibility_timeout_s=5.0, block_ms=50)
    queues = open_role(client, run, "verifier", "verifier-0", **opts)
    verifier = VerifierService(pool, answers, queues["rollout_results"], queues["rewards"])

    def generate() -> None:
        while not stop.is_set():
            rollout.rollout_pass(block_ms=50)

    threads = [threading.Thread(target=generate, daemon=True),
               threading.Thread(target=serve_forever, args=(verifier, stop, "verifier-0"), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        yield verifier
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def requests(ids: list[str]) -> list[RolloutRequest]:
    return RolloutRequest.for_prompts([PromptRecord(pid, "q", "2", "q", (5, 6, 7)) for pid in ids], SamplingParams(n=N))


def client_for(redis_url: str, run: str, share: float) -> RolloutClient:
    cfg = load_config(None, [f"run.name={run}", f"verifier.max_error_share={share}", "rollout.step_timeout_s=120",
                             "redis.block_ms=50"])
    return RolloutClient(cfg, redis_url)


def test_verifier_errors_are_counted_and_a_step_with_too_many_fails_naming_the_limit(redis_url, redis_client,
                                                                                      key_prefix, pool):
    coordinator = client_for(redis_url, key_prefix, 0.25)
    with fleet(redis_client, key_prefix, pool, {"a": "2", "b": "2"}) as verifier:
        samples = coordinator.generate_rollouts(0, 0, requests(["a"]))  # 1 error of 4: not above the limit
        assert len(samples) == N and [s.reward for s in samples if s.sample_index == 2] == [0.0]
        assert coordinator.counters()["verifier_errors_total"] == 1 and verifier.counts["errors"] == 1

        coordinator.cfg.verifier.max_error_share = 0.2
        with pytest.raises(RuntimeError, match=r"step 1: 1 of 4 rewards .*verifier\.max_error_share=0\.2\b"):
            coordinator.generate_rollouts(1, 0, requests(["b"]))
        assert coordinator.counters()["verifier_errors_total"] == 2


def test_verifier_errors_are_exported_beside_the_timeouts(store):  # noqa: F811 - fixture
    control = RunControl(store, steps_total=10, poll_s=0.02)
    control.publish(step_record(1, verifier_errors_total=3), 1)
    control.publish(step_record(2, verifier_errors_total=5), 2)
    text = generate_latest(metrics_registry(store)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["pcl_verifier_errors"].type == "counter"
    assert [s.value for s in families["pcl_verifier_errors"].samples if s.name.endswith("_total")] == [5.0]
    assert [s.value for s in families["pcl_verifier_timeouts"].samples if s.name.endswith("_total")] == [0.0]
