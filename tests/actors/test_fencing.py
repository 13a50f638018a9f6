"""An actor process whose instance was started again elsewhere (its node frozen or cut off from the head, then
back) ends itself at its next heartbeat, on real Ray and a real Redis: it never acts alongside the new process."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.redis]


def test_a_superseded_actor_process_exits_at_its_next_beat(ray_session, tmp_path):
    from services.redis_server import start_embedded

    with start_embedded(tmp_path / "redis", appendonly=False) as redis_server:
        check_superseded_actor_exits(redis_server.url)


def check_superseded_actor_exits(embedded_redis_url: str) -> None:
    import ray

    from actors.runtime import FENCED_EXIT
    from services.incarnations import Heartbeat, Identity, read_incarnations
    from services.redis_server import make_client

    @ray.remote(max_restarts=0)
    class Beating:
        def __init__(self, url: str) -> None:
            from actors.runtime import beat_with

            self.beat = beat_with(make_client(url), "fencing", "rollout", "rollout-7")

        def pid(self) -> int:
            import os

            return os.getpid()

    client = make_client(embedded_redis_url)
    actor = Beating.remote(embedded_redis_url)
    pid = ray.get(actor.pid.remote(), timeout=120)
    deadline = time.monotonic() + 60
    while not [e for e in read_incarnations(client, "fencing") if e["pid"] == pid]:
        assert time.monotonic() < deadline, "the actor never beat"
        time.sleep(0.1)
    newer = Heartbeat(client, "fencing", Identity("rollout", "rollout-7", incarnation="started-elsewhere"))
    assert newer.beat() is not None  # Ray started rollout-7 again elsewhere
    with pytest.raises(ray.exceptions.RayActorError) as died:
        while time.monotonic() < deadline:
            ray.get(actor.pid.remote(), timeout=30)
            time.sleep(0.1)
    assert str(FENCED_EXIT) in str(died.value) or "exit" in str(died.value).lower(), died.value
    old = next(e for e in read_incarnations(client, "fencing") if e["pid"] == pid)
    new = next(e for e in read_incarnations(client, "fencing") if e["incarnation"] == "started-elsewhere")
    assert old["last_ms"] < new["first_ms"]  # never alive together
