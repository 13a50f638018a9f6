"""The control plane while its Redis restarts (a private embedded server, SIGKILLed and started again, as the
driver's keeper does): the reads of the run's state answer from their last good reading, marked stale, and fresh
again once Redis is back; a mutation made while Redis is down waits for it and lands; with no reading yet, or a
write not recorded in time, 503 with Retry-After."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pcl.strategies.prompt_curriculum import PCLStrategy
from services.control.api import create_app
from services.control.outage import Readings
from services.control.run import RunControl
from services.control.server import ControlServer
from services.control.store import ControlStore
from services.redis_server import make_client, ping
from tests.services.control_fixtures import AUTH, TOKEN, step_record

pytestmark = pytest.mark.redis
READS = ("/v1/status", "/v1/history", "/v1/events", "/metrics")


@pytest.fixture
def plane(embedded_redis):
    """A run at step 2 whose control plane reads a Redis the test can restart: (HTTP client, the Redis)."""
    client = make_client(embedded_redis.url, decode_responses=True)
    store = ControlStore(client, "outage")
    rc = RunControl(store, steps_total=10, poll_s=0.02)
    store.set_k_max(16)
    rc.at_step_boundary(0, PCLStrategy(m=8, n=4, tau=0.5, k=4))
    rc.publish(step_record(1), 1)
    rc.publish(step_record(2), 2)
    server = ControlServer(create_app(store, TOKEN), "127.0.0.1", 0).start()
    with httpx.Client(base_url=server.url, timeout=30) as api:
        yield api, embedded_redis
    server.stop()
    client.close()


def redis_down(api: httpx.Client, handle, downtime_s: float) -> threading.Thread:
    """SIGKILL the Redis, start it again after downtime_s (in a thread); returns once the plane sees it gone."""
    restart = threading.Thread(target=handle.restart, kwargs={"kill": True, "downtime_s": downtime_s}, daemon=True)
    restart.start()
    deadline = time.monotonic() + downtime_s
    while api.get("/readyz").status_code != 503:  # /readyz keeps its contract: 503 while Redis is away
        assert time.monotonic() < deadline, "the control plane never saw Redis go"
        time.sleep(0.02)
    return restart


def store_up(api: httpx.Client) -> float:
    families = {f.name: f for f in text_string_to_metric_families(api.get("/metrics").text)}
    return families["pcl_control_store_up"].samples[0].value


def test_reads_answer_the_last_good_reading_while_redis_restarts_then_fresh_again(plane):
    api, handle = plane
    before = {path: api.get(path) for path in READS}  # the readings to fall back on
    assert all(r.status_code == 200 for r in before.values())
    assert before["/v1/status"].json()["stale"] is None and "pcl-stale" not in before["/v1/status"].headers
    assert store_up(api) == 1.0
    restart = redis_down(api, handle, downtime_s=3.0)
    status = api.get("/v1/status")
    assert status.status_code == 200, status.text
    assert status.json()["step"] == 2 and status.json()["last_step"]["effective_ratio"] == 0.5
    stale = status.json()["stale"]
    assert "Redis unreachable" in stale["reason"] and 0 <= stale["age_s"] < 30 and stale["as_of"] <= time.time()
    assert status.headers["pcl-stale"].startswith("age_s=")
    history, events = api.get("/v1/history"), api.get("/v1/events")
    assert history.status_code == 200 and [r["step"] for r in history.json()["records"]] == [1, 2]
    assert history.json()["stale"]["reason"] == stale["reason"]
    assert events.status_code == 200 and events.json() == before["/v1/events"].json() and "pcl-stale" in events.headers
    assert store_up(api) == 0.0
    restart.join(30)
    fresh = api.get("/v1/status")
    assert fresh.status_code == 200 and fresh.json()["stale"] is None and "pcl-stale" not in fresh.headers
    assert api.get("/readyz").status_code == 200 and store_up(api) == 1.0


def test_a_control_plane_that_has_served_nothing_yet_answers_from_its_first_reading(plane):
    """A resumed driver's new control plane, its Redis killed before any request came (`pcl chaos`, seed 2: six
    503s from a fresh control plane while the keeper was not yet running)."""
    api, handle = plane
    restart = redis_down(api, handle, downtime_s=2.0)  # /readyz only: no read has run through the app
    status = api.get("/v1/status")
    assert status.status_code == 200 and status.json()["step"] == 2 and status.json()["stale"] is not None
    assert store_up(api) == 0.0
    restart.join(30)


@pytest.mark.parametrize("method, path, body, event", [
    ("POST", "/v1/pause", None, "pause_requested"),
    ("PATCH", "/v1/params", {"tau": 0.3}, "params_requested"),
    ("POST", "/v1/checkpoint", None, "checkpoint_requested"),
])
def test_a_mutation_while_redis_restarts_waits_for_it_and_lands(plane, method, path, body, event):
    api, handle = plane
    restart = redis_down(api, handle, downtime_s=2.0)
    answer = api.request(method, path, json=body, headers=AUTH)
    assert answer.status_code == 202, answer.text
    restart.join(30)
    assert [e["type"] for e in api.get("/v1/events").json()].count(event) == 1  # recorded once
    status = api.get("/v1/status").json()
    assert status["pause_requested"] if event == "pause_requested" else True
    assert status["pending_params"] == {"tau": 0.3} if event == "params_requested" else True
    assert status["checkpoint"]["pending"] if event == "checkpoint_requested" else True


def test_a_control_plane_started_while_redis_is_down_waits_for_it_to_read(plane):
    """A resumed driver's control plane started in the second its Redis was down (`pcl chaos`, seed 2: one 503):
    with no reading to answer from, a read waits for Redis (the keeper brings it back within a second)."""
    api, handle = plane
    restart = redis_down(api, handle, downtime_s=2.0)
    store = ControlStore(make_client(handle.url, decode_responses=True), "outage")
    assert not ping(handle.url)
    server = ControlServer(create_app(store, TOKEN), "127.0.0.1", 0).start()  # no first reading: Redis is down
    try:
        status = httpx.get(f"{server.url}/v1/status", timeout=30)
        assert status.status_code == 200 and status.json()["step"] == 2 and status.json()["stale"] is None
    finally:
        server.stop()
        store.client.close()
        restart.join(30)


def test_no_reading_yet_and_a_write_not_recorded_in_time_are_503_with_retry_after():
    dead = ControlStore(make_client("redis://127.0.0.1:1/0", decode_responses=True), "nowhere")
    server = ControlServer(create_app(dead, TOKEN, redis_wait_s=0.5), "127.0.0.1", 0).start()
    try:
        for path in READS:
            answer = httpx.get(f"{server.url}{path}")
            assert answer.status_code == 503 and answer.headers["retry-after"] == "2", path
        started = time.monotonic()
        answer = httpx.post(f"{server.url}/v1/pause", headers=AUTH, timeout=30)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "2"
        assert 0.5 <= time.monotonic() - started < 10  # tried again for redis_wait_s, then refused
    finally:
        server.stop()


def test_readings_keep_the_last_good_answer_of_each_query():
    import redis

    readings, calls = Readings(kept=2), []

    def down():
        calls.append(1)
        raise redis.ConnectionError("gone")

    assert readings.read("a", lambda: {"x": 0}) == ({"x": 0}, None)
    readings.read("b", lambda: 2)
    readings.read("a", lambda: {"x": 1})
    readings.read("c", lambda: 3)  # "b" is now the least recently read: dropped
    value, stale = readings.read("a", down)
    assert value == {"x": 1} and stale["age_s"] >= 0 and "ConnectionError" in stale["reason"]
    with pytest.raises(redis.ConnectionError):
        readings.read("b", down)
    with pytest.raises(redis.ResponseError):  # Redis answered: the request's own error, never a stale answer
        readings.read("a", lambda: (_ for _ in ()).throw(redis.ResponseError("bad id")))


def test_a_redis_that_stops_answering_is_met_with_the_last_good_reading_within_seconds(embedded_redis, tmp_path):
    """A Redis that holds its connections open and answers nothing (its process frozen, its node cut off from the
    network, a proxy in front of a Redis that is down): the kernel still accepts, so only a socket timeout ends the
    wait. The control plane, as `pcl train` starts it, answers a status read from its last good reading within
    CONTROL_REDIS_TIMEOUT_S and its retries, not after Redis' client default of 30 s a try."""
    import os
    import signal

    from pcl.config import load_config
    from services.control.server import CONTROL_REDIS_TIMEOUT_S, DriverControl

    cfg = load_config(None, ["run.name=frozen", "control.port=0", f"control.token={TOKEN}"])
    plane = DriverControl(cfg, embedded_redis.url, tmp_path, k_max=8, fresh=True)
    pid = embedded_redis.pid
    try:
        plane.store.add_history(step_record(1))
        with httpx.Client(base_url=plane.server.url, timeout=60, headers=AUTH) as api:
            assert api.get("/v1/status").status_code == 200  # the reading to fall back on
            os.kill(pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                status = api.get("/v1/status")
                took = time.monotonic() - started
            finally:
                os.kill(pid, signal.SIGCONT)
            assert status.status_code == 200 and "Redis unreachable" in status.json()["stale"]["reason"], status.text
            assert took < 3 * CONTROL_REDIS_TIMEOUT_S + 2, took
            deadline = time.monotonic() + 30
            while api.get("/v1/status").json()["stale"] is not None:  # fresh again once Redis answers
                assert time.monotonic() < deadline, "the control plane stayed stale after Redis answered again"
                time.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)
        plane.close()
