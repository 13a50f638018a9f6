"""The actors' health the control plane publishes after every step, on real Ray: a frozen actor (its process
stopped with SIGSTOP, as a stalled node leaves it) is reported 'unresponsive' without holding every later step for
the ping timeout, and it is asked once, not once a step."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytestmark = [pytest.mark.ray]

TIMEOUT_S = 2.0


def test_a_frozen_actor_costs_the_ping_timeout_once_and_holds_one_ping(ray_session):
    import ray

    from actors.handles import ActorHealth

    @ray.remote(max_restarts=0)
    class Pinged:
        def __init__(self) -> None:
            self.pings = 0

        def ping(self) -> bool:
            self.pings += 1
            return True

        def pid(self) -> int:
            return os.getpid()

        def count(self) -> int:
            return self.pings

    healthy, frozen = Pinged.remote(), Pinged.remote()
    pid = ray.get(frozen.pid.remote(), timeout=120)
    health = ActorHealth(lambda: {"rollout-0": healthy, "rollout-1": frozen}, TIMEOUT_S)
    assert health() == {"rollout-0": "ok", "rollout-1": "ok"}
    os.kill(pid, signal.SIGSTOP)
    try:
        assert health()["rollout-1"] == "unresponsive"  # the first look after the freeze waits the timeout
        seconds = []
        for _ in range(3):  # every later step: not held again
            start = time.monotonic()
            assert health() == {"rollout-0": "ok", "rollout-1": "unresponsive"}
            seconds.append(time.monotonic() - start)
        assert max(seconds) < TIMEOUT_S / 2, seconds
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ray.get(frozen.count.remote(), timeout=60) == 2  # the ping before the freeze, one during it
    deadline = time.monotonic() + 60
    while health()["rollout-1"] != "ok":  # thawed: its pending answer arrives, it is asked again
        assert time.monotonic() < deadline, "the thawed actor was never seen answering again"
    ray.kill(healthy)
    ray.kill(frozen)
