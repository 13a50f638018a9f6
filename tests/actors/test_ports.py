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
