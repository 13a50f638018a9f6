"""The run's events (services/run_events.py): windows written as they open and close, read back as windows (one a
killed driver left open ends at the next driver's start), and what writes them on a real embedded Redis: the
keeper's restart of a killed server and the driver's probe seeing Redis full, then gone."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import redis

from services.redis_keeper import EmbeddedRedisKeeper, RedisProbe
from services.redis_server import start_embedded
from services.run_events import EVENTS_FILE, RunEvents, read_events


def test_windows_are_read_back_and_one_a_killed_driver_left_open_ends_at_the_next_start(tmp_path):
    assert read_events(tmp_path) is None  # no record is not "no outage"
    first = RunEvents(tmp_path)
    first.end(first.begin("driver_start", "a fresh start", start=100.0), 130.0)
    first.record("redis_restart", 140.0, 141.5, "restart 1: killed by signal 9")
    first.begin("redis_unreachable", "ConnectionError", start=150.0)  # then the driver is SIGKILLed
    second = RunEvents(tmp_path)
    second.begin("driver_start", "resumed from step-000010", start=160.0)  # still starting when the run is read
    with open(tmp_path / EVENTS_FILE, "a") as out:
        out.write('{"id": "9-1", "type": "resta')  # a line cut short by a kill
    windows = read_events(tmp_path)
    assert [(w["type"], w["start"], w["end"]) for w in windows] == [
        ("driver_start", 100.0, 130.0), ("redis_restart", 140.0, 141.5), ("redis_unreachable", 150.0, 160.0),
        ("driver_start", 160.0, None)]
    assert windows[1]["detail"] == "restart 1: killed by signal 9" and windows[0]["pid"] == os.getpid()
    with pytest.raises(ValueError, match="unknown run event type 'outage'"):
        first.begin("outage")


def test_the_keeper_records_each_restart_of_the_server_as_a_window(tmp_path):
    events = RunEvents(tmp_path)
    with start_embedded(tmp_path / "redis", appendonly=True) as handle:
        keep = EmbeddedRedisKeeper(handle, limit=2, events=events)
        keep()  # running: seen now, nothing recorded
        assert read_events(tmp_path) is None
        killed = time.time()
        os.kill(handle.pid, signal.SIGKILL)
        handle.process.wait(timeout=10)
        keep()
        [window] = read_events(tmp_path)
        assert window["type"] == "redis_restart" and window["start"] <= killed <= window["end"] <= time.time()
        assert "restart 1: killed by signal 9" in window["detail"]


def fill(client: redis.Redis) -> None:
    client.mset({f"filler:{i}": b"f" * 10_000 for i in range(300)})
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 500_000)


def test_the_drivers_probe_records_redis_full_then_unreachable(tmp_path):
    events = RunEvents(tmp_path)
    with start_embedded(tmp_path / "redis", appendonly=False) as handle:
        client = handle.client()
        probe = RedisProbe(handle.client(socket_timeout=2.0), "pcl:t:driver_probe", events)
        assert probe() is None and read_events(tmp_path) is None
        last_ok = probe.last_ok
        fill(client)
        assert probe() == "redis_full" and probe() == "redis_full"  # one window while it lasts
        client.delete(*[f"filler:{i}" for i in range(300)])
        assert probe() is None
        handle.stop()
        assert probe() == "redis_unreachable"
        probe.close()
    full, gone = read_events(tmp_path)
    assert (full["type"], full["start"]) == ("redis_full", last_ok) and full["end"] <= gone["start"]
    assert "maxmemory" in full["detail"] and gone["type"] == "redis_unreachable" and gone["end"] >= gone["start"]
    lines = [json.loads(line) for line in (tmp_path / EVENTS_FILE).read_text().splitlines()]
    assert [("type" in line, line["id"]) for line in lines] == [
        (True, lines[0]["id"]), (False, lines[0]["id"]), (True, lines[2]["id"]), (False, lines[2]["id"])]
