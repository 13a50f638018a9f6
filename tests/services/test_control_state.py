"""The run's control state on a real Redis server: requests, what the coordinator applies at step boundaries
(and the step it records), pauses that block and release, Prometheus totals that survive a coordinator
restart, and a control channel that never stops training when Redis is gone."""

from __future__ import annotations

import threading
import time

import pytest

from pcl.strategies.prompt_curriculum import PCLStrategy
from pcl.strategies.uniform import UniformStrategy
from services.control.state import ControlConflict, ControlValueError
from services.control.store import ControlStore
from services.control.metrics import bucket_field
from pcl.engines import SamplingParams
from services.streams.payloads import RequestRecord, pack_tokens
from services.streams.topology import open_queue, stream_key
from services.redis_server import make_client
from services.control.run import RunControl
from tests.services.control_fixtures import step_record, store  # noqa: F401 - a fixture

pytestmark = pytest.mark.redis


@pytest.fixture
def control(store):
    rc = RunControl(store, steps_total=10, poll_s=0.02)
    yield rc
    rc.finish(rc.status["step"])


def boundary_in_thread(control: RunControl, step: int, strategy) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(
        target=lambda: out.append(control.at_step_boundary(step, strategy)), daemon=True
    )
    thread.start()
    return thread, out


def wait_for(predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_a_pause_or_resume_is_in_the_event_log_before_anyone_can_see_it(store, redis_url):
    """A second client, polling like the coordinator does, never sees `paused` changed without the event that
    asked for the change already in the log (the flip and its event are one transaction)."""
    control_key, events_key = store.control_key, store.events_key
    watcher = make_client(redis_url, decode_responses=True)
    readings, mismatched, stop = 0, [], threading.Event()

    def watch() -> None:
        nonlocal readings
        while not stop.is_set():
            pipe = watcher.pipeline(transaction=True)  # both read at one instant
            pipe.hget(control_key, "paused")
            pipe.xrevrange(events_key, count=1)
            paused, newest = pipe.execute()
            kind = newest[0][1]["type"] if newest else None
            if kind != {"1": "pause_requested"}.get(paused or "0", "resume_requested" if newest else None):
                mismatched.append((paused, kind))
            readings += 1

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            store.request_pause()
            store.request_resume()
    finally:
        stop.set()
        thread.join(timeout=10)
        watcher.close()
    assert readings > 50 and not mismatched, (readings, mismatched[:3])
    assert [e["type"] for e in store.events(limit=400)] == ["pause_requested", "resume_requested"] * 200


def test_pause_blocks_at_the_boundary_until_resume_and_records_the_step(store, control):
    strategy = PCLStrategy(m=8, n=4, tau=0.5, k=4)
    control.publish(step_record(3), policy_version=3)
    store.request_pause()
    assert store.status()["state"] == "pausing"  # asked for, not yet applied: the step in flight completes
    with pytest.raises(ControlConflict, match="already paused"):
        store.request_pause()

    reads, read = [], store.desired  # the boundary's reads of what is asked for
    store.desired = lambda: reads.append(1) or read()
    thread, out = boundary_in_thread(control, 3, strategy)  # before the 4th step
    wait_for(lambda: store.status()["state"] == "paused")
    paused_seen, seen_reads = time.monotonic(), len(reads)
    wait_for(lambda: len(reads) >= seen_reads + 2)  # it has looked again, twice, and ...
    assert thread.is_alive() and not out  # ... stays blocked while paused
    status = store.status()
    assert status["paused"] and status["step"] == 3 and status["coordinator"]["alive"]

    held_s = time.monotonic() - paused_seen
    store.request_resume()
    thread.join(timeout=60)
    assert not thread.is_alive() and out[0] >= held_s  # returns the seconds paused
    kinds = [(e["type"], e["step"]) for e in store.events()]
    assert kinds == [("pause_requested", None), ("paused", 4), ("resume_requested", None), ("resumed", 4)]
    assert store.status()["state"] == "running"
    with pytest.raises(ControlConflict, match="not paused"):
        store.request_resume()


def test_params_apply_at_the_next_boundary_even_while_paused(store, control):
    strategy = PCLStrategy(m=8, n=4, tau=0.5, k=4)
    control.publish(step_record(1), policy_version=1)
    store.set_k_max(16)
    store.request_params(tau=0.3)
    assert store.status()["pending_params"] == {"tau": 0.3}
    assert strategy.tau == 0.5  # nothing changes mid-step

    assert control.at_step_boundary(1, strategy) == 0.0
    assert (strategy.tau, strategy.k, strategy.pool_size) == (0.3, 4, 32)
    applied = [e for e in store.events() if e["type"] == "params_applied"]
    assert applied[-1]["step"] == 2 and applied[-1]["data"] == {"tau": 0.3, "previous": {"tau": 0.5}}

    store.request_pause()
    thread, _ = boundary_in_thread(control, 2, strategy)
    wait_for(lambda: store.status()["state"] == "paused")
    store.request_params(k=8)
    wait_for(lambda: store.status()["k"] == 8)  # applied while paused, for the step that follows the pause
    assert strategy.k == 8 and store.status()["pending_params"] == {}
    store.request_resume()
    thread.join(timeout=60)
    assert strategy.pool_size == 64
    assert [e["step"] for e in store.events() if e["type"] == "params_applied"] == [2, 3]


def test_bad_params_and_conflicts_are_refused(store, control):
    store.set_k_max(4)
    with pytest.raises(ControlValueError, match="k=5 exceeds k_max=4"):
        store.request_params(k=5)
    with pytest.raises(ControlValueError, match="tau and/or k"):
        store.request_params()

    uniform = UniformStrategy(m=8, n=4)
    control.at_step_boundary(0, uniform)  # publishes that this run's strategy has nothing to tune
    with pytest.raises(ControlConflict, match="'uniform' has no tau"):
        store.request_params(tau=0.4)

    control.finish(0)
    for request in (store.request_pause, store.request_checkpoint, lambda: store.request_params(tau=0.2)):
        with pytest.raises(ControlConflict, match="has finished"):
            request()


def test_the_coordinator_refuses_a_k_the_training_set_cannot_fill(store, control):
    strategy = PCLStrategy(m=8, n=4, tau=0.5, k=4)
    store.request_params(k=50)  # no k_max known yet: accepted by the API
    store.set_k_max(10)
    control.at_step_boundary(0, strategy)
    control.at_step_boundary(1, strategy)
    assert strategy.k == 4
    refused = [e for e in store.events() if e["type"] == "params_refused"]
    assert len(refused) == 1 and "k=50 exceeds k_max=10" in refused[0]["data"]["reason"]  # recorded once


def test_the_coordinator_tunes_through_the_strategy_and_refuses_what_it_rejects(store, control):
    strategy = PCLStrategy(m=8, n=4, tau=0.5, k=4)
    store.client.hset(store.control_key, mapping={"tau": "1.5", "k": "2"})  # past the API: tune() validates
    control.at_step_boundary(0, strategy)
    assert (strategy.tau, strategy.k) == (0.5, 2)
    refused = [e for e in store.events() if e["type"] == "params_refused"]
    assert len(refused) == 1 and "selection.tau: 1.5 is outside [0.0, 1.0]" in refused[0]["data"]["reason"]
    applied = [e for e in store.events() if e["type"] == "params_applied"]
    assert applied[-1]["data"] == {"previous": {"k": 4}, "k": 2}


def test_a_resume_override_replaces_the_control_planes_value_with_an_event(store, control):
    strategy = PCLStrategy(m=8, n=4, tau=0.5, k=4)
    control.at_step_boundary(0, strategy)
    store.request_params(tau=0.3)
    assert store.override_params({"tau": 0.4, "k": 4}) == {"tau": "0.3"}  # k was never asked for: untouched
    assert store.desired().tau == 0.4 and store.desired().k is None
    event = store.events()[-1]
    assert event["type"] == "params_overridden" and event["data"] == {"previous": {"tau": "0.3"}, "tau": 0.4}
    control.at_step_boundary(1, strategy)
    assert strategy.tau == 0.4  # the hash no longer holds the value the override replaced
    assert store.override_params({"tau": 0.4}) == {}


def test_checkpoint_request_is_seen_at_the_boundary_and_cleared_when_written(store, control):
    strategy = PCLStrategy(m=8, n=4, tau=0.5, k=4)
    request = store.request_checkpoint()
    with pytest.raises(ControlConflict, match="still pending"):
        store.request_checkpoint()
    assert control.checkpoint_requested() is None  # not seen before a step boundary
    control.at_step_boundary(0, strategy)
    assert control.checkpoint_requested() == request["id"]
    control.checkpoint_done(request["id"], "/runs/x/checkpoints/step-1")
    assert control.checkpoint_requested() is None and store.desired().checkpoint is None
    assert store.status()["checkpoint"]["last"]["path"] == "/runs/x/checkpoints/step-1"
    assert store.events()[-1]["type"] == "checkpoint_written"
    assert store.request_checkpoint()["id"] != request["id"]  # a new one may be asked for


def test_totals_accumulate_across_a_coordinator_restart(store, control):
    control.publish(step_record(1, step_seconds=0.7), 1)
    control.publish(step_record(2, step_seconds=45.0), 2)
    totals = store.totals()
    assert totals["samples_total"] == 64 and totals["generated_tokens_total"] == 400
    assert totals[bucket_field("step_seconds", 1.0)] == 1 and totals[bucket_field("step_seconds", 60.0)] == 1
    assert totals["step_seconds_sum"] == pytest.approx(45.7)

    restarted = RunControl(store, poll_s=0.02)  # its RolloutClient counts from zero again
    restarted.publish(step_record(3, samples_total=32), 3)
    assert store.totals()["samples_total"] == 96  # never goes back
    restarted.finish(3)


def test_history_keeps_one_record_per_step_and_drops_steps_a_resume_replays(store, control):
    control.publish({"step": 0, "eval_accuracy": 0.2}, 0)
    for step in (1, 2, 3):
        control.publish(step_record(step), step)
    control.publish(step_record(2, train_reward_mean=0.9), 2)  # resumed from the checkpoint of step 1
    rows = store.history()
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["train_reward_mean"] == 0.9
    assert [r["step"] for r in store.history(after_step=0)] == [1, 2]
    assert rows[-1]["samples_total"] == 64 and "value_loss" not in rows[-1]  # every figure the step has, no nulls


def test_the_step_the_curriculum_stalls_and_the_step_it_pays_again_are_events(store, control):
    gains = [(0.01, 0), (0.0, 1), (0.01, 2), (0.2, 0), (0.2, 0)]  # (gain, steps in a row stalled) of steps 1-5
    for step, (gain, stalled) in enumerate(gains, start=1):
        control.publish(step_record(step, curriculum_gain=gain, curriculum_stalled=stalled), step)
    events = [e for e in store.events() if e["type"].startswith("curriculum_")]
    assert [(e["type"], e["step"], e["source"]) for e in events] == [
        ("curriculum_stalled", 2, "coordinator"), ("curriculum_recovered", 4, "coordinator")]
    stalled, recovered = events[0]["data"], events[1]["data"]
    assert stalled["curriculum_gain"] == 0.0 and stalled["uniform_effective_ratio"] == 0.3
    assert "raise k" in stalled["advice"] and "move tau" in stalled["advice"] and "selection.type" in stalled["advice"]
    assert recovered == {"curriculum_gain": 0.2, "uniform_effective_ratio": 0.3, "stalled_steps": 2}


def test_status_says_lost_when_the_heartbeat_stops(store):
    rc = RunControl(store, poll_s=0.02)
    rc.publish(step_record(1), 1)
    assert store.status()["state"] == "running" and store.status()["coordinator"]["alive"]
    rc._stop.set()  # a coordinator that died: no finish(), its heartbeat key expires
    rc._heartbeat.join()
    store.clear_heartbeat()
    assert store.status()["state"] == "lost"


def test_the_coordinators_heartbeat_lives_as_long_as_control_heartbeat_ttl_s(store):
    """control.heartbeat_ttl_s: how long the status waits for a beat before it says "lost"; the coordinator beats
    every third of it at most."""
    rc = RunControl(store, poll_s=0.02, heartbeat_s=60.0, heartbeat_ttl_s=4.5)
    try:
        ttl_ms = store.client.pttl(store.heartbeat_key)
        assert 3000 < ttl_ms <= 4500, ttl_ms
        first = store.client.get(store.heartbeat_key)
        wait_for(lambda: store.client.get(store.heartbeat_key) != first, timeout_s=30)  # beaten again, 1.5 s on
    finally:
        rc.finish(0)


@pytest.mark.parametrize(
    "server", ["redis_url", "embedded_redis_url"]
)  # Redis 7 has lag; the embedded 6.2 not
def test_queue_depths_count_unacknowledged_entries(server, request, key_prefix):
    url = request.getfixturevalue(server)
    client, text_client = make_client(url), make_client(url, decode_responses=True)
    store = ControlStore(text_client, key_prefix)
    requests = open_queue(client, store.run, "rollout_requests", "w1")
    try:  # payloads are binary: token ids 0xF0F0F0F0 are not UTF-8
        requests.put(
            [
                RequestRecord(store.run, 0, 0, f"p{i}", pack_tokens([0xF0F0F0F0] * 8), 0, SamplingParams(n=4))
                for i in range(5)
            ]
        )
        assert store.queue_depths() == {"rollout_requests": 5, "rollout_results": 0, "rewards": 0}
        requests.ack(requests.take(2, block_ms=10))
        assert store.queue_depths()["rollout_requests"] == 3
    finally:
        store.reset()
        client.delete(stream_key(store.run, "rollout_requests"))
        client.close()
        text_client.close()


def test_training_goes_on_when_redis_is_unreachable():
    dead = ControlStore(
        make_client("redis://127.0.0.1:1/0", decode_responses=True, socket_connect_timeout=0.2), "nowhere"
    )
    rc = RunControl(dead, poll_s=0.01)
    strategy = PCLStrategy(m=8, n=4, tau=0.5, k=4)
    start = time.monotonic()
    assert rc.at_step_boundary(0, strategy) == 0.0
    rc.publish(step_record(1), 1)
    rc.finish(1)
    assert strategy.tau == 0.5 and time.monotonic() - start < 10
