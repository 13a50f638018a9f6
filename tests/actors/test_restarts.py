"""The driver's restarts (entrypoints/train.py): a failure that a restart can cure is retried, also when it comes
while the fleet is starting (an actor killed in its constructor), not only while the fleet runs; the driver's start
and its restart are windows of the run's events (RUN_DIR/events.jsonl)."""

from __future__ import annotations

import pytest

from pcl.config import load_config

pytestmark = [pytest.mark.ray, pytest.mark.redis]


def test_an_actor_lost_while_the_fleet_starts_is_a_restart(untrained_tiny, ray_session, tmp_path, monkeypatch):
    """`pcl chaos` found it: a learner rank killed in its __init__ during a restart ended the driver."""
    import ray.exceptions

    import entrypoints.fleet
    from entrypoints.train import run_training

    starts = []

    def start_fleet(cfg, prep, redis_url, placement_timeout_s=120.0, kept=None):
        starts.append(redis_url)
        if len(starts) == 1:  # as a rank that died before answering its first call
            raise ray.exceptions.ActorDiedError()
        raise RuntimeError("the second start was reached")

    monkeypatch.setattr(entrypoints.fleet, "start_fleet", start_fleet)
    model = str(untrained_tiny)
    cfg = load_config("configs/tiny.yaml", [f"model.path={model}", f"value.path={model}", "data.tiny_size=256",
                                            "data.eval_size=16", "control.enabled=false", "checkpoint.max_restarts=2"])
    with pytest.raises(RuntimeError, match="the second start was reached"):
        run_training(cfg, run_dir=str(tmp_path / "run"))
    assert len(starts) == 2  # the lost actor cost a restart (from the start: no checkpoint yet), not the run
    from services.run_events import read_events

    start, restart = [w for w in read_events(tmp_path / "run") if w["type"] in ("driver_start", "restart")]
    assert (start["type"], start["detail"], restart["type"]) == ("driver_start", "a fresh start", "restart")
    assert start["start"] < start["end"] <= restart["start"]  # the start ended in the failure the restart began at
    assert "ActorDiedError" in restart["detail"] and restart["end"] is None  # the second start never came up
