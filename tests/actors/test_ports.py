"""The Ray and Redis implementations of the step loop's ports (`actors/ports.py`, `services.control.run`)
have every method of the port they implement, with the port's parameters: the loop's unit tests on fakes
(`tests/pcl/loop/`) and the runs on the fleet exercise the same interface."""

from __future__ import annotations

import inspect

import pytest

from actors.ports import ActorScorer, FleetLearner, SamplerPrompts, StreamRollouts
from pcl.loop import ports
from services.control.run import RunControl

IMPLEMENTATIONS = [(ports.Prompts, SamplerPrompts), (ports.Scorer, ActorScorer), (ports.Learner, FleetLearner),
                   (ports.Rollouts, StreamRollouts), (ports.Control, RunControl)]


def members(protocol) -> list[str]:
    return [name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")]


@pytest.mark.parametrize(("port", "implementation"), IMPLEMENTATIONS, ids=lambda x: x.__name__)
def test_each_implementation_has_the_ports_methods_and_parameters(port, implementation):
    assert members(port)
    for name in members(port):
        assert hasattr(implementation, name), f"{implementation.__name__} lacks {port.__name__}.{name}"
        wanted = list(inspect.signature(getattr(port, name)).parameters)
        given = list(inspect.signature(getattr(implementation, name)).parameters)
        assert given[:len(wanted)] == wanted, f"{implementation.__name__}.{name}{given} is not the port's {wanted}"


@pytest.mark.ray
def test_a_restarted_rollout_worker_waits_for_the_next_sync_while_the_learner_trains_ahead(ray_session):
    """Asynchronous steps: the learner's weights are no longer the fleet's version while it trains ahead, so a
    restarted worker is not given them; with no worker left serving that version the run must restart."""
    from types import SimpleNamespace

    import ray

    from actors.ports import FleetBehind

    @ray.remote(num_cpus=0)
    class StubWorker:
        def __init__(self, version: int):
            self.version = version

        def policy_version(self) -> int:
            return self.version

        def serve(self) -> None:
            pass

    def started(*versions: int) -> list:
        """Stub workers that have answered once: the fleet check gives a worker 2 s to answer and counts a slower one
        as restarting, which an actor still starting on a loaded machine would be."""
        workers = [StubWorker.remote(v) for v in versions]
        ray.get([w.policy_version.remote() for w in workers], timeout=120)
        return workers

    reloads: list[int] = []
    fleet = FleetLearner.__new__(FleetLearner)  # no learner group: only the fleet check runs
    fleet.workers, fleet.policy_version, fleet.worker_reloads, fleet.timeout_s = started(3, -1), 3, 0, 30.0
    fleet.sender = SimpleNamespace(reload=lambda worker, version: reloads.append(version))
    fleet.straggling, fleet.behind, fleet.ahead = set(), set(), True
    fleet.check_fleet()
    assert reloads == [] and fleet.worker_reloads == 0  # the other worker serves version 3 meanwhile
    fleet.ahead = False  # synced: the learner's weights are the fleet's version again
    fleet.check_fleet()
    assert reloads == [3] and fleet.worker_reloads == 1
    fleet.workers, fleet.ahead = started(-1), True
    with pytest.raises(FleetBehind, match="no rollout worker serves policy version 3"):
        fleet.check_fleet()
