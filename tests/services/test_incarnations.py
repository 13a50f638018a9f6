"""The run's incarnation registry on a real Redis (services/incarnations.py): each beat is recorded in the server's
clock with the actor's identity, an ended heartbeat is no longer live, two processes acting as one instance at
once are seen as such by the partition check, a handover is not, and a heartbeat never fails its actor."""

from __future__ import annotations

import os
import socket
import time

import pytest

from pcl.tools.partition_checks import check_incarnations
from services.incarnations import (INCARNATION, Heartbeat, Identity, clear_incarnations, live_incarnations,
                                   read_incarnations)
from services.redis_server import make_client

pytestmark = pytest.mark.redis


def next_ms(client) -> None:
    """Return once the server's clock has moved to a later millisecond (beats then fall in distinct ones)."""
    seconds, micros = client.time()
    start = seconds * 1000 + micros // 1000
    while True:
        seconds, micros = client.time()
        if seconds * 1000 + micros // 1000 > start:
            return


def test_each_beat_is_recorded_in_the_servers_clock_and_an_ended_heartbeat_is_not_live(redis_client, key_prefix):
    beat = Heartbeat(redis_client, key_prefix, Identity("rollout", "rollout-1", node="node-a"))
    first = beat.beat()
    next_ms(redis_client)
    last = beat.beat()
    assert first is not None and last > first
    [entry] = read_incarnations(redis_client, key_prefix)
    assert entry == {"role": "rollout", "instance": "rollout-1", "node": "node-a", "actor": "",
                     "host": socket.gethostname(), "pid": os.getpid(), "incarnation": INCARNATION, "first_ms": first,
                     "last_ms": last, "ended_ms": None, "progress": None}
    assert [e["instance"] for e in live_incarnations(redis_client, key_prefix)] == ["rollout-1"]
    beat.stop()  # never started: a last beat, marked ended
    [entry] = read_incarnations(redis_client, key_prefix)
    assert entry["ended_ms"] is not None and entry["last_ms"] == entry["ended_ms"] >= last
    assert live_incarnations(redis_client, key_prefix) == []
    clear_incarnations(redis_client, key_prefix)
    assert read_incarnations(redis_client, key_prefix) == []


def test_a_process_its_instance_started_again_elsewhere_is_fenced_and_never_alive_with_the_new_one(redis_client,
                                                                                                   key_prefix):
    """rollout-0 started again elsewhere while its first process was cut off (a node cut off from the head, then
    back): the first process's next beat is refused, it is told so (on_fenced, once) and beats no more, so the two
    are never alive together. verifier-0 started again after its first process's last beat: a plain handover.
    Before the fence, the old process's beat was written and the check saw two live incarnations."""
    fenced: list[str] = []

    def heartbeat(instance: str, incarnation: str, host: str) -> Heartbeat:
        identity = Identity(instance.split("-")[0], instance, node=host, host=host, incarnation=incarnation)
        return Heartbeat(redis_client, key_prefix, identity, on_fenced=lambda: fenced.append(incarnation))

    beats = {key: heartbeat(*key) for key in [("verifier-0", "v-old", "a"), ("rollout-0", "r-old", "a"),
                                              ("verifier-0", "v-new", "b"), ("rollout-0", "r-new", "b")]}
    for key in [("verifier-0", "v-old", "a"), ("verifier-0", "v-old", "a"), ("rollout-0", "r-old", "a"),
                ("verifier-0", "v-new", "b"), ("rollout-0", "r-new", "b")]:
        next_ms(redis_client)
        assert beats[key].beat() is not None, key
    old = beats[("rollout-0", "r-old", "a")]
    next_ms(redis_client)
    assert old.beat() is None and old.fenced.is_set() and fenced == ["r-old"]  # back, and superseded
    assert old.beat() is None and fenced == ["r-old"]  # told once; it beats no more
    next_ms(redis_client)
    assert beats[("rollout-0", "r-new", "b")].beat() is not None  # the new one goes on
    incarnations = read_incarnations(redis_client, key_prefix)
    assert [e["incarnation"] for e in incarnations] == ["v-old", "r-old", "v-new", "r-new"]
    check = check_incarnations(incarnations, {"rollout-0", "verifier-0"})
    assert check.ok, check.detail
    r_old, r_new = (next(e for e in incarnations if e["incarnation"] == i) for i in ("r-old", "r-new"))
    assert r_old["last_ms"] < r_new["first_ms"]


def test_a_started_heartbeat_beats_from_its_thread_until_stopped(redis_client, key_prefix):
    beat = Heartbeat(redis_client, key_prefix, Identity("learner", "learner-0"), every_s=0.05).start()
    deadline = time.monotonic() + 30
    while beat.beats < 3:  # the thread's own count of beats written
        assert time.monotonic() < deadline, "the heartbeat thread wrote fewer than 3 beats in 30 s"
        time.sleep(0.01)
    beat.stop()
    assert not beat.thread.is_alive()
    [entry] = read_incarnations(redis_client, key_prefix)
    assert entry["ended_ms"] is not None and entry["first_ms"] < entry["last_ms"]


def test_a_heartbeat_that_cannot_reach_redis_skips_its_beat_and_never_raises():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = make_client(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5)
    beat = Heartbeat(client, "nowhere", Identity("sampler", "sampler"))
    assert beat.beat() is None and beat.beats == 0
    beat.stop()  # its last beat fails the same way


def test_a_serving_workers_beat_carries_its_progress(redis_client, key_prefix):
    """What the coordinator reads to tell a straggler from a slow healthy pass (services/streams/stragglers.py)."""
    progress = {"busy_s": 0.0, "samples": 0}
    beat = Heartbeat(redis_client, key_prefix, Identity("rollout", "rollout-0"), progress=lambda: dict(progress))
    beat.beat()
    assert read_incarnations(redis_client, key_prefix)[0]["progress"] == {"busy_s": 0.0, "samples": 0}
    progress.update(busy_s=12.5, samples=64)  # a pass under way
    beat.beat()
    assert read_incarnations(redis_client, key_prefix)[0]["progress"] == {"busy_s": 12.5, "samples": 64}
