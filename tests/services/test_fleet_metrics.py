"""The rollout fleet's figures of a step reach Prometheus: each worker's samples (by `worker` label) and the
engine-learner log-probability gap, published through the coordinator's RunControl on a real Redis."""

from __future__ import annotations

from prometheus_client import generate_latest

from services.control.metrics import metrics_registry
from services.control.run import RunControl
from tests.services.control_fixtures import step_record, store  # noqa: F401 - a fixture


def test_samples_by_worker_and_the_logprob_gap_are_exported(store):
    control = RunControl(store, health=lambda: {"rollout-0": "ok", "rollout-1": "dead"}, poll_s=0.02)
    try:
        control.publish(step_record(1, rollout_samples_by_worker={"rollout-0": 260, "rollout-1": 252},
                                    rollout_logprob_gap_mean=0.0123, rollout_logprob_gap_max=0.5), 1)
        text = generate_latest(metrics_registry(store)).decode()
    finally:
        control.finish(1)
    run = store.run
    assert f'pcl_rollout_samples_by_worker{{run="{run}",worker="rollout-0"}} 260.0' in text
    assert f'pcl_rollout_samples_by_worker{{run="{run}",worker="rollout-1"}} 252.0' in text
    assert f'pcl_rollout_logprob_gap_mean{{run="{run}"}} 0.0123' in text
    assert f'pcl_rollout_logprob_gap_max{{run="{run}"}} 0.5' in text
    assert store.status()["actors"] == {"rollout-0": "ok", "rollout-1": "dead"}  # the health the actors gave
