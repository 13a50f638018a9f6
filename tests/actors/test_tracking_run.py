"""`pcl train` with every tracker at once, on real parts (local Ray, embedded Redis, a 2-rank gloo learner, the HF
engine, math-verify) and an untrained tiny-task policy: a 2-step run, then `--resume` to 4 steps. Each tracker,
read back offline with its own reader, holds one run with steps 0-4 each once and the values of metrics.jsonl;
the run ids are in the checkpoint; the end of each run prints `pcl summary`'s report."""

from __future__ import annotations

import json
import uuid

import pytest

from pcl.config import load_config
from pcl.loop.runlog import read_metrics
from services.tracking.trackers import TRACKERS_FILE, tracker_metrics
from tests.services import tracker_readers as read

# Two training runs (about 2 minutes on an idle 2-core machine, 5 under load): the default suite has the same
# checks per library, without the training, in tests/services/test_tracking.py.
pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.slow]


def one_value_per_step(stored: dict) -> dict:
    for key, steps in stored.items():
        for step, values in steps.items():
            assert len(values) == 1, f"{key} written {len(values)} times at step {step}"
    return {key: {step: values[0] for step, values in steps.items()} for key, steps in stored.items()}


def test_trackers_hold_one_run_per_backend_through_a_resume(untrained_tiny, ray_session, tmp_path, monkeypatch,
                                                            capsys):
    from entrypoints.train import run_training

    read.offline_env(monkeypatch)
    project = f"pcl-test-{uuid.uuid4().hex[:8]}"
    model, run_dir = str(untrained_tiny), tmp_path / "run"
    overrides = [f"model.path={model}", f"value.path={model}", "run.m=8", "run.n=4", "run.eval_every=2",
                 "data.eval_size=16", "data.tiny_size=256", "selection.k=2", "value.ev_sample=4",
                 "run.time_budget_s=null", "control.port=0", f"logging.project={project}",
                 "logging.backends=[console,tensorboard,wandb,mlflow,trackio]"]
    assert run_training(load_config("configs/tiny.yaml", [*overrides, "run.steps=2"]), run_dir=str(run_dir)) == 0
    ids = json.loads((run_dir / TRACKERS_FILE).read_text())["ids"]
    saved = json.loads((run_dir / "checkpoints" / "step-000002" / TRACKERS_FILE).read_text())
    assert saved["ids"] == ids and set(ids) == {"tensorboard", "wandb", "mlflow", "trackio"}
    assert run_training(load_config("configs/tiny.yaml", [*overrides, "run.steps=4"]), run_dir=str(run_dir),
                        resume="") == 0

    want: dict[str, dict[int, float]] = {}
    for record in read_metrics(run_dir / "metrics.jsonl"):
        for key, value in tracker_metrics(record).items():
            want.setdefault(key, {})[record["step"]] = value
    assert {"pcl/effective_ratio", "timing_s/generation", "value/selected_mean", "eval/held_out"} <= set(want)
    assert sorted(want["eval/held_out"]) == [0, 2, 4] and sorted(want["pcl/effective_ratio"]) == [1, 2, 3, 4]

    def check(got: dict) -> None:
        got = one_value_per_step({k: v for k, v in got.items() if k in want})
        assert set(got) == set(want)
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key

    check(read.tensorboard_scalars(run_dir / "tensorboard"))
    mlflow = read.mlflow_runs(f"sqlite:///{run_dir / 'mlflow.db'}", project)
    assert list(mlflow) == [ids["mlflow"]] and mlflow[ids["mlflow"]]["status"] == "FINISHED"
    check(mlflow[ids["mlflow"]]["metrics"])
    assert mlflow[ids["mlflow"]]["metrics"]["summary/steps"] == {2: [2.0], 4: [4.0]}  # each run's end
    wandb = read.wandb_offline_runs(run_dir / "wandb")
    assert list(wandb) == [ids["wandb"]] and wandb[ids["wandb"]]["files"] == 2
    check(wandb[ids["wandb"]]["history"])
    assert wandb[ids["wandb"]]["config"]["run.m"] == 8
    trackio = read.trackio_runs(project)
    assert list(trackio) == [ids["trackio"]]
    check(trackio[ids["trackio"]])

    out = capsys.readouterr().out
    assert out.count("held-out accuracy") == 2 and out.count("s/step: selection") == 2
    assert f"metrics {run_dir / 'metrics.jsonl'}; checkpoint {(run_dir / 'checkpoints' / 'step-000004').resolve()}" \
        in out
