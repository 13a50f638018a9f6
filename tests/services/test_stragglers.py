"""A frozen worker does not freeze the step: its work is handed to the live workers after the straggler timeout, and
its late copy is dropped and counted when it thaws.

A real Redis server, the coordinator's real RolloutClient, the real RolloutService and VerifierService serving loops
and the real RewardPool with math-verify. The visibility timeout is sized, as docs/operations.md says, above the
longest a healthy worker holds an entry (here 600 s: a chunk of a large step on GPUs takes minutes), so it reclaims
nothing within the test: only the straggler timeout (`rollout.straggler_timeout_s`, `verifier.straggler_timeout_s`;
null, the default, derives it from the measured seconds per sample) moves the work. A worker freezes in the middle
of a pass, as a SIGSTOPped process or a hung engine does: its engine (or its reward pool) blocks on a gate."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest

from pcl.config import load_config
from pcl.data.prompts import PromptRecord
from pcl.engines import RolloutRequest, SamplingParams
from pcl.reward.pool import RewardPool
from services.incarnations import INCARNATION, Heartbeat, Identity
from services.streams.rollout_client import RolloutClient
from services.streams.topology import open_role
from services.streams.workers import RolloutService, VerifierService
from tests.services.test_stale_producers import GatedEngine, serving, wait_for

pytestmark = pytest.mark.redis
N = 3
PROMPTS = {"a": (5, 6, 7), "b": (8, 9, 10)}
HEALTHY_HOLD_S = 600.0  # the visibility timeout: above any healthy pass, so it reclaims nothing here
STEP_TIMEOUT_S = 45.0  # what holds the step without a handover (then the step fails)


def requests_of() -> list[RolloutRequest]:
    prompts = [PromptRecord(pid, "q", "2", "q", tokens) for pid, tokens in PROMPTS.items()]
    return RolloutRequest.for_prompts(prompts, SamplingParams(n=N))


def step_in_thread(coordinator: RolloutClient, step: int, requests) -> tuple[threading.Thread, list, list]:
    """generate_rollouts(step) in a thread: (thread, [its samples], [its error])."""
    results, errors = [], []

    def generate() -> None:
        try:
            results.append(coordinator.generate_rollouts(step, 0, requests))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    return thread, results, errors


def test_a_frozen_rollout_workers_chunk_is_handed_to_the_live_worker_and_its_late_copy_dropped(
        redis_url, redis_client, key_prefix):
    run = key_prefix
    cfg = load_config(None, [f"run.name={run}", f"rollout.step_timeout_s={STEP_TIMEOUT_S}", "redis.block_ms=50",
                             f"redis.visibility_timeout_s={HEALTHY_HOLD_S}", "rollout.num_workers=2"])
    coordinator = RolloutClient(cfg, redis_url)  # a step's requests in 2 chunks, one per worker
    requests = requests_of()
    frozen, live = GatedEngine(), GatedEngine()
    queues = {name: open_role(redis_client, run, name.split("-")[0], name, cfg.redis)
              for name in ("rollout-0", "rollout-1", "verifier-0")}
    rollout = {name: RolloutService(engine, queues[name]["rollout_requests"], queues[name]["rollout_results"],
                                    worker=name) for name, engine in (("rollout-0", frozen), ("rollout-1", live))}
    with RewardPool(processes=1, timeout_s=30.0) as pool:
        verifier = VerifierService(pool, {pid: "2" for pid in PROMPTS}, queues["verifier-0"]["rollout_results"],
                                   queues["verifier-0"]["rewards"])
        with serving({"verifier-0": verifier}):
            with serving(rollout):  # a healthy step: the fleet's seconds per sample are measured
                assert len(coordinator.generate_rollouts(0, 0, requests)) == len(PROMPTS) * N
            frozen.gate.clear()
            frozen.entered.clear()
            before = rollout["rollout-0"].counts["samples"]  # its share of step 0
            with serving({"rollout-0": rollout["rollout-0"]}):
                step1, results, errors = step_in_thread(coordinator, 1, requests)
                assert frozen.entered.wait(30), "rollout-0 never took its chunk of step 1"
                with serving({"rollout-1": rollout["rollout-1"]}):  # takes its own chunk, then rollout-0's copy
                    step1.join(STEP_TIMEOUT_S + 30)
                    assert not errors, f"step 1 waited for the frozen worker: {errors[0]!r}"
                    assert results and len(results[0]) == len(PROMPTS) * N, "step 1 did not complete"
                    counters = coordinator.counters()
                    assert counters["rollout_samples_by_worker"] == {"rollout-1": len(PROMPTS) * N}
                    assert counters["handed_over_by_worker"] == {"rollout-0": N}  # its chunk: one prompt

                    frozen.gate.set()  # rollout-0 thaws: its step-1 results go out after step 1 committed
                    wait_for(lambda: rollout["rollout-0"].counts["samples"] == before + N, "rollout-0's late results")
                    wait_for(lambda: verifier.counts["verified"] == 2 * len(PROMPTS) * N + N,
                             "the late results scored")
                    step2 = coordinator.generate_rollouts(2, 0, requests)

    assert sorted((s.prompt_id, s.sample_index) for s in step2) == sorted(
        (pid, j) for pid in PROMPTS for j in range(N))  # every sample once: the late copy trained on nowhere
    counters = coordinator.counters()
    assert counters["dropped_stale_step"] == N
    assert counters["dropped_stale_by_producer"] == {f"rollout-0@{INCARNATION}": N}


class GatedPool:
    """A reward pool whose score_batch blocks while `gate` is closed (and says so with `entered`)."""

    def __init__(self, pool: RewardPool) -> None:
        self.pool, self.gate, self.entered = pool, threading.Event(), threading.Event()

    def score_batch(self, items):
        self.entered.set()
        self.gate.wait()
        return self.pool.score_batch(items)


@contextmanager
def beating(client, run: str, services: dict):
    """Each service's heartbeat with its progress, as a worker actor beats it (actors/runtime.py)."""
    beats = [Heartbeat(client, run, Identity(name.split("-")[0], name), every_s=0.2, progress=service.progress).start()
             for name, service in services.items()]
    try:
        yield
    finally:
        for beat in beats:
            beat.stop()


def test_a_frozen_verifiers_results_are_handed_over_it_is_named_stuck_and_its_late_notes_dropped_by_it(
        redis_url, redis_client, key_prefix):
    run = key_prefix
    cfg = load_config(None, [f"run.name={run}", f"rollout.step_timeout_s={STEP_TIMEOUT_S}", "redis.block_ms=50",
                             f"redis.visibility_timeout_s={HEALTHY_HOLD_S}", "verifier.num_workers=2",
                             "verifier.straggler_timeout_s=1.5", "verifier.stuck_timeout_s=4"])
    stuck: set[str] = set()
    coordinator = RolloutClient(cfg, redis_url, on_watch=lambda watch: stuck.update(s.instance for s in watch.stuck()))
    requests = requests_of()
    queues = {name: open_role(redis_client, run, name.split("-")[0], name, cfg.redis)
              for name in ("rollout-0", "verifier-0", "verifier-1")}
    rollout = RolloutService(GatedEngine(), queues["rollout-0"]["rollout_requests"],
                             queues["rollout-0"]["rollout_results"], worker="rollout-0")
    answers = {pid: "2" for pid in PROMPTS}
    with RewardPool(processes=1, timeout_s=30.0) as pool:
        frozen = GatedPool(pool)
        verifiers = {name: VerifierService(p, answers, queues[name]["rollout_results"], queues[name]["rewards"],
                                           verifier=name) for name, p in (("verifier-0", frozen), ("verifier-1", pool))}
        workers = {"rollout-0": rollout, **verifiers}
        with beating(redis_client, run, workers), serving({"rollout-0": rollout, "verifier-0": verifiers["verifier-0"]}):
            step1, results, errors = step_in_thread(coordinator, 1, requests)
            assert frozen.entered.wait(30), "verifier-0 never took step 1's results"
            with serving({"verifier-1": verifiers["verifier-1"]}):
                step1.join(STEP_TIMEOUT_S + 30)
                assert not errors, f"step 1 waited for the frozen verifier: {errors[0]!r}"
                assert results and len(results[0]) == len(PROMPTS) * N
                assert coordinator.counters()["handed_over_by_worker"] == {"verifier-0": len(PROMPTS) * N}
                wait_for(lambda: coordinator.watch_fleet() or "verifier-0" in stuck,  # as each step's wait does
                         "verifier-0 named stuck after verifier.stuck_timeout_s")
                assert coordinator.watch.straggling("verifier") == {"verifier-0"}

                frozen.gate.set()  # verifier-0 thaws: its notes on step 1 go out after step 1 committed
                wait_for(lambda: verifiers["verifier-0"].counts["verified"] == len(PROMPTS) * N, "the late notes")
                step2 = coordinator.generate_rollouts(2, 0, requests)

    assert len(step2) == len(PROMPTS) * N and stuck == {"verifier-0"}
    counters = coordinator.counters()
    assert counters["dropped_stale_step"] == len(PROMPTS) * N
    assert counters["dropped_late_by_verifier"] == {f"verifier-0@{INCARNATION}": len(PROMPTS) * N}
    assert counters["dropped_stale_by_producer"] == {f"rollout-0@{INCARNATION}": len(PROMPTS) * N}


def test_a_hung_rollout_worker_that_still_beats_is_left_out_of_the_next_steps_chunks(redis_url, redis_client,
                                                                                      key_prefix):
    run = key_prefix
    cfg = load_config(None, [f"run.name={run}", f"rollout.step_timeout_s={STEP_TIMEOUT_S}", "redis.block_ms=50",
                             f"redis.visibility_timeout_s={HEALTHY_HOLD_S}", "rollout.num_workers=2",
                             "rollout.straggler_timeout_s=1.5"])
    coordinator = RolloutClient(cfg, redis_url)
    requests = requests_of()
    hung = GatedEngine(open_=False)
    queues = {name: open_role(redis_client, run, name.split("-")[0], name, cfg.redis)
              for name in ("rollout-0", "rollout-1", "verifier-0")}
    rollout = {name: RolloutService(engine, queues[name]["rollout_requests"], queues[name]["rollout_results"],
                                    worker=name) for name, engine in (("rollout-0", hung), ("rollout-1", GatedEngine()))}
    with RewardPool(processes=1, timeout_s=30.0) as pool:
        verifier = VerifierService(pool, {pid: "2" for pid in PROMPTS}, queues["verifier-0"]["rollout_results"],
                                   queues["verifier-0"]["rewards"], verifier="verifier-0")
        with beating(redis_client, run, {**rollout, "verifier-0": verifier}), serving({"verifier-0": verifier}):
            with serving({"rollout-0": rollout["rollout-0"]}):
                step1, results, errors = step_in_thread(coordinator, 1, requests)
                assert hung.entered.wait(30), "rollout-0 never took its chunk of step 1"
                with serving({"rollout-1": rollout["rollout-1"]}):
                    step1.join(STEP_TIMEOUT_S + 30)
                    assert not errors and results, f"step 1 did not complete: {errors}"
                    assert coordinator.watch.straggling("rollout") == {"rollout-0"}  # its heartbeat: busy, no end
                    assert coordinator.live_workers() == 1
                    step2 = coordinator.generate_rollouts(2, 0, requests)  # one chunk, for rollout-1
                    counters = coordinator.counters()
                hung.gate.set()

    assert len(step2) == len(PROMPTS) * N
    assert counters["rollout_samples_by_worker"] == {"rollout-1": len(PROMPTS) * N}
    assert counters["handed_over_by_worker"] == {"rollout-0": N}  # step 1's chunk; step 2 gave it nothing
