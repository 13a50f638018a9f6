"""Fixtures of the control-plane tests, imported by name by the modules that use them: a run's control state
on the session's real Redis server, a control plane serving it from a real uvicorn on an ephemeral port, and a
coordinator's side that has published an evaluation and two steps."""

from __future__ import annotations

import httpx
import pytest

from pcl.strategies.prompt_curriculum import PCLStrategy
from services.control.api import create_app
from services.control.server import ControlServer
from services.control.store import ControlStore
from services.redis_server import make_client
from services.control.run import RunControl

TOKEN = "s3cret-test-token-0123456789abcdef"  # 32+ characters, as the control plane requires
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# A PCL step's curriculum figures (pcl/loop/curriculum_window.py): V's reliability over two bins of V on the probe and
# one on the trained prompts, the pool of 8 candidates, the band tau +- 0.15, the gain over uniform selection.
CURRICULUM = {
    "value_version": 1, "value_lag": 1, "probe_brier": 0.04, "probe_calibration_error": 0.1,
    "trained_brier": 0.06, "trained_calibration_error": 0.2,
    "probe_reliability_predicted": {"0.1-0.2": 0.15, "0.5-0.6": 0.55},
    "probe_reliability_realized": {"0.1-0.2": 0.25, "0.5-0.6": 0.45},
    "probe_reliability_count": {"0.1-0.2": 3, "0.5-0.6": 1},
    "trained_reliability_predicted": {"0.4-0.5": 0.45}, "trained_reliability_realized": {"0.4-0.5": 0.25},
    "trained_reliability_count": {"0.4-0.5": 4},
    "pool_histogram": {"0-0.1": 2, "0.1-0.2": 3, "0.4-0.5": 2, "0.5-0.6": 1},
    "selected_band_width": 0.15, "expected_effective_ratio": 0.9, "uniform_effective_ratio": 0.3,
    "curriculum_gain": 0.2, "expectation_gap": 0.4, "curriculum_stalled": 0, "curriculum_stalled_steps_total": 0,
}


def step_record(step: int, **extra) -> dict:
    """A training step's metrics record as the coordinator logs it (a PCL step's)."""
    return {
        "step": step,
        "effective_ratio": 0.5,
        "train_reward_mean": 0.25,
        "selected_value_mean": 0.48,
        "value_explained_variance": 0.1,
        "generation_seconds": 0.7,
        "selection_seconds": 0.04,
        "train_seconds": 0.3,
        "weight_sync_seconds": 0.02,
        "step_seconds": 1.1,
        "tau": 0.5,
        "k": 4.0,
        "samples_total": 32 * step,
        "generated_tokens_total": 200 * step,
        "verifier_timeouts_total": 0,
        **CURRICULUM,
        **extra,
    }


@pytest.fixture
def store(redis_url, key_prefix, redis_client):  # redis_client deletes the run's keys afterwards
    client = make_client(redis_url, decode_responses=True)
    yield ControlStore(client, key_prefix)
    client.close()


@pytest.fixture
def server(store):
    srv = ControlServer(create_app(store, TOKEN), "127.0.0.1", 0).start()
    yield srv
    srv.stop()


@pytest.fixture
def api(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:  # generous: a loaded machine
        yield client


@pytest.fixture
def running(store):
    """A coordinator's side that has published an evaluation and two steps."""
    rc = RunControl(store, steps_total=10, poll_s=0.02)
    store.set_k_max(16)
    rc.at_step_boundary(0, PCLStrategy(m=8, n=4, tau=0.5, k=4))
    rc.publish({"step": 0, "eval_accuracy": 0.125}, 0)
    rc.publish(step_record(1), 1)
    rc.publish(step_record(2, step_seconds=75.0), 2)
    yield rc
    rc.finish(2)
