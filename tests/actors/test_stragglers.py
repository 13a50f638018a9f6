"""A stopped rollout worker on real parts: local Ray, an embedded Redis server, two RolloutWorker actors (HF engine) and
a RewardVerifier, the coordinator's RolloutClient, FleetLearner and FleetRepair (what actors/coordinator.py wires),
with the learner's weights put in Ray's object store as an rpc weight sync takes them. One worker's process is
stopped with SIGSTOP, as a frozen node or a debugger stops it.

- continued after a while: no step and no weight sync waits for it (its chunk is handed to the other worker, the
  sync leaves it out), and once continued it takes the current weights and its share again; its late results are
  dropped, counted by its process;
- stopped past its stuck timeout: its process is killed and Ray starts it again (a new incarnation, never two at
  once), and the fleet check gives it the weights."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager

import pytest

from tests.actors.test_fleet_balance import fleet_config

pytestmark = [pytest.mark.ray, pytest.mark.redis]
M, N = 8, 4
WAIT_S = 180.0


class ObjectStoreWeights:
    """The learner group's part in an rpc weight sync (`actors.weight_sync.RpcWeights`): its weights in Ray's object
    store, here the policy's own."""

    def __init__(self, policy_path: str):
        from transformers import AutoModelForCausalLM

        self.state = AutoModelForCausalLM.from_pretrained(policy_path).state_dict()

    def state_ref(self):
        import ray

        return ray.put(self.state)


@pytest.fixture
def fleet(untrained_tiny, tmp_path):
    """start(run, *overrides) -> (client, learner, repair, handles by instance, prepared inputs, redis client)."""
    import ray

    from actors.ports import FleetLearner
    from actors.runtime import start_ray
    from actors.stragglers import FleetRepair
    from entrypoints.probe_batch import start_generation_fleet
    from entrypoints.train import prepare
    from services.redis_server import make_client, start_embedded
    from services.streams.rollout_client import RolloutClient

    started, own_ray = [], start_ray()
    with start_embedded(tmp_path / "redis", appendonly=False) as redis_server:
        def start(run: str, *overrides: str):
            cfg = fleet_config(untrained_tiny, 2, run, f"run.m={M}", f"run.n={N}", "rollout.max_new_tokens=16",
                               "data.max_prompt_tokens=32", "redis.visibility_timeout_s=600",
                               "rollout.straggler_timeout_s=3", *overrides)
            prep = prepare(cfg, str(tmp_path / run), None)
            actors = start_generation_fleet(cfg, prep, redis_server.url)  # the verifier, then the rollout workers
            started.extend(actors)
            handles = {"verifier-0": actors[0], "rollout-0": actors[1], "rollout-1": actors[2]}
            learner = FleetLearner(cfg, ObjectStoreWeights(prep.policy_path), actors[1:], None)
            repair = FleetRepair(learner, handles)
            client = RolloutClient(cfg, redis_server.url, live_workers=learner.live_workers, on_watch=repair)
            return client, learner, repair, handles, prep, make_client(redis_server.url)

        try:
            yield start
        finally:
            for actor in started:
                ray.kill(actor, no_restart=True)
            if own_ray:
                ray.shutdown()


def process_of(redis_client, run: str, instance: str) -> dict:
    """The newest incarnation of `instance` in the run's heartbeat registry (its pid among its fields)."""
    from services.incarnations import read_incarnations

    return [e for e in read_incarnations(redis_client, run) if e["instance"] == instance][-1]


def until(condition, what: str, client=None) -> None:
    """Wait for `condition()`, looking at the fleet's progress each time when given the client (as a step does)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_S:g} s"
        if client is not None:
            client.watch_fleet()
        time.sleep(0.2)


@contextmanager
def stopped(pid: int):
    """The process stopped (SIGSTOP) inside the block, continued after it whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_stopped_rollout_worker_holds_no_step_or_weight_sync_and_rejoins_when_continued(fleet):
    client, learner, repair, _, prep, redis_client = fleet("frozen", "rollout.stuck_timeout_s=600")
    run, prompts = client.run, prep.train_prompts
    assert len(client.generate(1, 0, prompts[:M], N)) == M * N
    frozen = process_of(redis_client, run, "rollout-0")
    requests, held = client.requests, []

    def stop_when_it_holds_its_chunk() -> None:
        while not held:
            held.extend(requests.client.xpending_range(requests.stream, requests.group, "-", "+", 10,
                                                       consumername="rollout-0"))
        os.kill(frozen["pid"], signal.SIGSTOP)

    stopper = threading.Thread(target=stop_when_it_holds_its_chunk, daemon=True)
    stopper.start()
    try:
        step2 = client.generate(2, 0, prompts[M:2 * M], N)  # rollout-0's chunk is handed to rollout-1
        stopper.join()
        assert len(step2) == M * N and client.counters()["handed_over_by_worker"] == {"rollout-0": M * N // 2}
        # a straggler once its silence passes a beat's grace and its timeout (it may have been stopped before its
        # heartbeat said it had begun the pass, and the step can end before that)
        until(lambda: learner.straggling == {0}, "rollout-0 seen as a straggler", client)
        start = time.monotonic()
        learner.sync_weights(1)  # rollout-0 is left out
        assert learner.behind == {0} and time.monotonic() - start < 60
        assert learner.live_workers() == 1
        assert len(client.generate(3, 1, prompts[2 * M:3 * M], N)) == M * N
        assert client.counters()["rollout_samples_by_worker"] == {"rollout-1": M * N}
    finally:
        os.kill(frozen["pid"], signal.SIGCONT)
    until(lambda: not learner.behind and not learner.straggling, "rollout-0 back with version 1", client)
    assert learner.live_workers() == 2 and repair.restarts == {}
    assert len(client.generate(4, 1, prompts[3 * M:4 * M], N)) == M * N
    counters = client.counters()
    assert set(counters["rollout_samples_by_worker"]) == {"rollout-0", "rollout-1"}
    late = counters["dropped_stale_by_producer"]  # rollout-0's step-2 chunk, generated once it was continued
    assert late == {f"rollout-0@{frozen['incarnation']}": M * N // 2}, late


def test_a_rollout_worker_stopped_past_its_stuck_timeout_is_restarted_by_ray(fleet):
    import ray

    from pcl.tools.partition_checks import overlaps
    from services.incarnations import read_incarnations

    client, learner, repair, handles, prep, redis_client = fleet("stuck", "rollout.stuck_timeout_s=8")
    run, prompts = client.run, prep.train_prompts
    assert len(client.generate(1, 0, prompts[:M], N)) == M * N
    old = process_of(redis_client, run, "rollout-0")
    with stopped(old["pid"]):
        until(lambda: repair.restarts == {"rollout-0": 1}, "rollout-0 restarted as stuck", client)
        until(lambda: process_of(redis_client, run, "rollout-0")["incarnation"] != old["incarnation"],
              "a new process of rollout-0 beating", client)
    assert not os.path.exists(f"/proc/{old['pid']}/status") or "zombie" in open(f"/proc/{old['pid']}/status").read()
    assert overlaps(read_incarnations(redis_client, run)) == []  # never two processes of rollout-0 at once
    assert ray.get(handles["rollout-0"].policy_version.remote(), timeout=60) == -1  # restarted: waits for weights
    client.watch_fleet()
    assert learner.straggling == set()  # its new process beats
    learner.check_fleet()  # as a step's wait does: version 0, it is told to serve
    assert ray.get(handles["rollout-0"].policy_version.remote(), timeout=60) == 0
    assert len(client.generate(2, 0, prompts[M:2 * M], N)) == M * N
    assert client.counters()["rollout_samples_by_worker"].keys() == {"rollout-0", "rollout-1"}
