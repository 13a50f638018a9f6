"""The rollout and verifier serving loops on a real Redis server, a real HF engine and real math-verify.

The on-policy invariant is tested here twice: a rollout worker never serves a request of another policy
version, and the step's collector drops a result generated with version v-1 that was injected into
step v's reward stream, so it is never trained on.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pcl.engines.hf import HFEngine
from pcl.reward.pool import RewardPool
from pcl.engines import Generation, RolloutRequest, SamplingParams
from services.streams.payloads import RequestRecord, RewardRecord, RolloutResult, pack_tokens
from services.streams.collector import StepCollector
from services.streams.topology import open_queue
from services.streams.workers import RolloutService, VerifierService

pytestmark = pytest.mark.redis


def queues(client, run: str, name: str):
    opts = dict(visibility_timeout_s=5.0, max_deliveries=3, block_ms=50)
    return tuple(open_queue(client, run, stream, name, **opts)
                 for stream in ("rollout_requests", "rollout_results", "rewards"))


def request(run, step, pid, version, n=3, max_new_tokens=4, first_index=0):
    sampling = SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new_tokens)
    return RequestRecord.of(run, step, version, RolloutRequest(pid, (5, 6, 7), sampling, first_index))


@pytest.fixture
def engine(tiny_model_dir):
    return HFEngine(str(tiny_model_dir), device="cpu", seed=0, num_threads=1)


def test_rollout_service_serves_its_version_only(redis_client, key_prefix, engine):
    requests, results, _ = queues(redis_client, key_prefix, "w")
    service = RolloutService(engine, requests, results)
    requests.put([request(key_prefix, 0, "p0", 0), request(key_prefix, 0, "old", 0, n=2)])
    assert engine.policy_version == 0
    produced = 0
    for _ in range(5):
        produced += service.serve_once(block_ms=50)
    assert produced == 5  # 3 + 2 samples, all of version 0
    consumer = open_queue(redis_client, key_prefix, "rollout_results", "reader", block_ms=50)
    got = [r for d in consumer.take(100) for r in d.records]
    assert sorted((r.prompt_id, r.sample_index) for r in got) == [("old", 0), ("old", 1), ("p0", 0), ("p0", 1), ("p0", 2)]
    assert all(r.policy_version == 0 and len(r.token_ids) // 4 <= 4 for r in got)

    # After a weight sync to version 1, a request of version 0 is dropped and counted, never generated; one
    # of version 2 is handed back, not served with version-1 weights.
    service.load_weights(engine.model.state_dict(), 1)
    requests.put([request(key_prefix, 1, "stale", 0), request(key_prefix, 1, "ahead", 2)])
    for _ in range(3):
        assert service.serve_once(block_ms=50) == 0
    assert service.counts["stale_requests"] == 1 and service.counts["requests_ahead_of_weights"] >= 1
    assert consumer.take(100, block_ms=50) == []


def test_a_request_ahead_of_the_workers_weights_is_handed_back_without_counting_a_delivery(redis_client,
                                                                                            key_prefix):
    """A worker left behind by a weight sync (frozen meanwhile) takes the step's requests and hands them back until
    its weights come: however often, they are never dead-lettered as abandoned, and are served once they come."""
    requests = open_queue(redis_client, key_prefix, "rollout_requests", "w", visibility_timeout_s=0.4,
                          max_deliveries=2, block_ms=50)
    results = open_queue(redis_client, key_prefix, "rollout_results", "w", block_ms=50)
    engine = Recording()
    service = RolloutService(engine, requests, results)
    requests.put([request(key_prefix, 1, "ahead", 1)])
    for _ in range(400):  # taken (reclaimed) and handed back five times, each reclaim 0.1 s after the last
        assert service.serve_once(block_ms=50) == 0
        if service.counts["requests_ahead_of_weights"] >= 5 or requests.dead_letter_count():
            break
    assert requests.dead_letter_count() == 0 and service.counts["requests_ahead_of_weights"] >= 5
    engine.policy_version = 1  # its weights come
    while not (produced := service.serve_once(block_ms=50)):
        pass
    assert produced == 3 and requests.dead_letter_count() == 0


class Recording:
    """An engine stand-in that records each generate call (prompts, sampling) and answers one token a sample."""

    policy_version = 0

    def __init__(self) -> None:
        self.calls: list[tuple[int, SamplingParams]] = []

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params))
        return [[Generation(i, j, [1], "1", "stop", 1) for j in range(params.n)] for i in range(len(prompts))]


def test_requests_with_one_sampling_share_an_engine_call_that_gets_it_as_sent(redis_client, key_prefix):
    requests, results, _ = queues(redis_client, key_prefix, "w")
    engine = Recording()
    service = RolloutService(engine, requests, results)
    sampling = SamplingParams(n=2, temperature=0.6, top_p=0.9, top_k=5, max_new_tokens=7, seed=3)
    chunk = [RequestRecord.of(key_prefix, 0, 0, RolloutRequest(f"p{i}", (5, 6), s))
             for i, s in enumerate([sampling, sampling, replace(sampling, n=3), sampling])]
    requests.put([chunk])  # one entry: a chunk of four requests
    assert service.serve_once(block_ms=50) == 2 + 2 + 3 + 2
    assert engine.calls == [(3, sampling), (1, replace(sampling, n=3))]


def test_verifier_scores_and_zeroes_truncated(redis_client, key_prefix):
    _, results, rewards = queues(redis_client, key_prefix, "v")

    def result(pid, j, text, finish="stop"):
        return RolloutResult(key_prefix, 4, pid, j, 2, pack_tokens([1]), pack_tokens([2, 3]), text, finish, 0.01)

    results.put([result("a", 0, "12"), result("a", 1, "13"), result("b", 0, r"so \boxed{\frac{1}{2}}"),
                 result("b", 1, "0.5", finish="length"), result("nogold", 0, "1")])
    with RewardPool(processes=1, timeout_s=5.0) as pool:
        service = VerifierService(pool, {"a": "12", "b": "0.5"}, results, rewards)
        assert service.serve_once(block_ms=100) == 4
    collector = StepCollector(key_prefix, 4, 2, {("a", 0), ("a", 1), ("b", 0), ("b", 1)}, resolve=results.join)
    reader = open_queue(redis_client, key_prefix, "rewards", "c", block_ms=50)
    collector.offer_all(r for d in reader.take(100) for r in d.records)
    assert collector.complete
    got = {(r.prompt_id, r.sample_index): r.reward for r in collector.batch()}
    assert got == {("a", 0): 1.0, ("a", 1): 0.0, ("b", 0): 1.0, ("b", 1): 0.0}  # truncated -> 0
    assert service.counts["truncated"] == 1


def test_result_of_previous_policy_version_is_dropped_never_trained_on(redis_client, key_prefix):
    """On-policy invariant: a v-1 sample injected into step v's reward stream is dropped and counted."""
    _, _, rewards = queues(redis_client, key_prefix, "c")
    step, version = 7, 7

    def reward(j, v):
        res = RolloutResult(key_prefix, step, "p", j, v, pack_tokens([1]), pack_tokens([2]), "1", "stop", 0.0)
        return RewardRecord.from_result(res, 1.0, 0.0, False)

    rewards.put([reward(0, version - 1), reward(0, version), reward(1, version), reward(1, version)])
    collector = StepCollector(key_prefix, step, version, {("p", 0), ("p", 1)})
    collector.offer_all(r for d in rewards.take(100) for r in d.records)
    assert collector.complete
    assert all(r.policy_version == version for r in collector.batch())
    assert collector.dropped()["stale_version"] == 1 and collector.dropped()["duplicates"] == 1


def test_a_later_round_continues_sample_indices_and_never_collides_with_the_first(redis_client, key_prefix, engine):
    """Two generation rounds of one step ask for the same prompt: the second round's request carries
    first_index, so its samples are indices 3..4, and a late duplicate of round one is not collected."""
    requests, results, _ = queues(redis_client, key_prefix, "w")
    service = RolloutService(engine, requests, results)
    first = request(key_prefix, 2, "p", 0, n=3)
    second = request(key_prefix, 2, "p", 0, n=2, first_index=3)
    requests.put([first, second])
    while service.serve_once(block_ms=50):
        pass
    reader = open_queue(redis_client, key_prefix, "rollout_results", "reader", block_ms=50)
    got = [r for d in reader.take(100) for r in d.records]
    assert sorted(r.sample_index for r in got) == [0, 1, 2, 3, 4]
    round_two = StepCollector(key_prefix, 2, 0, {("p", 3), ("p", 4)})
    round_two.offer_all(got + got)  # round one's records, and every record delivered twice
    assert round_two.complete and [r.sample_index for r in round_two.batch()] == [3, 4]
    assert round_two.dropped()["unexpected"] == 6 and round_two.dropped()["duplicates"] == 2


def test_hostile_outputs_through_the_verifier_are_reward_0_timed_out_and_counted(redis_client, key_prefix):
    """Model outputs built to hang or blow up math-verify (an unclosed \\boxed{ bomb, a megabyte string, LaTeX
    nested thousands deep) pass through the verifier service as reward 0, marked timed out where the hard
    timeout hit, and counted; the good sample beside them is scored normally."""
    _, results, rewards = queues(redis_client, key_prefix, "hostile")
    hostile = {"bomb": "\\boxed{" * 100_000, "megabyte": "9" * 1_000_000,
               "nested": "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3001}

    def result(pid, text):
        return RolloutResult(key_prefix, 1, pid, 0, 1, pack_tokens([1]), pack_tokens([2]), text, "stop", 0.0)

    results.put([result(pid, text) for pid, text in hostile.items()] + [result("good", r"\boxed{5}")])
    with RewardPool(processes=1, timeout_s=2.0) as pool:
        service = VerifierService(pool, {pid: "5" for pid in [*hostile, "good"]}, results, rewards)
        served = 0
        while served < 4:
            served += service.serve_once(block_ms=100)
    collector = StepCollector(key_prefix, 1, 1, {(pid, 0) for pid in [*hostile, "good"]}, resolve=results.join)
    reader = open_queue(redis_client, key_prefix, "rewards", "c", block_ms=50)
    while not collector.complete:
        collector.offer_all(r for d in reader.take(100) for r in d.records)
    got = {r.prompt_id: r for r in collector.batch()}
    assert got["good"].reward == 1.0 and not got["good"].timed_out
    assert all(got[pid].reward == 0.0 for pid in hostile)
    timed_out = sum(bool(got[pid].timed_out) for pid in hostile)
    assert timed_out >= 1 and service.counts["timeouts"] == timed_out
