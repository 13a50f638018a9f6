"""services.tracking.trackers against the real tracker libraries, each offline and local (wandb offline mode, MLflow's
sqlite store in the run directory, TensorBoard event files, trackio's local database): the keys, steps and
values of a short run read back with each library's own reader, a resumed run appended to the same tracker run
with no step written twice, the config, a retune and the summary. The full `pcl train` path is in
tests/actors/test_tracking_run.py."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from pcl.config import ConfigError, load_config
import services.tracking.trackers as tracking
from services.tracking.trackers import Trackers, check_backends, flat_config, tracker_metrics
from tests.services import tracker_readers as read
from tests.services.control_fixtures import store  # noqa: F401 - a fixture

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")
RECORDS = [  # what the coordinator writes to metrics.jsonl: the step-0 evaluation, then one record per step
    {"step": 0, "eval_accuracy": 0.25, "policy_version": 0},
    *({"step": s, "policy_version": s, "effective_ratio": 0.5 + s / 100, "train_reward_mean": 0.3 + s / 50,
       "generation_seconds": 1.5 + s, "step_seconds": 3.0 + s, "value_explained_variance": None if s == 1 else 0.1 * s,
       "selected_value_mean": 0.45, "tau": 0.5, "k": 2.0, "suite_math500": 0.125 * s,
       **({"eval_accuracy": 0.25 + s / 20} if s % 2 == 0 else {})} for s in range(1, 6)),
]
EXPECTED_KEYS = {"pcl/effective_ratio", "pcl/train_reward_mean", "timing_s/generation", "timing_s/step",
                 "value/explained_variance", "value/selected_mean", "control/tau", "control/k", "eval/held_out",
                 "eval/math500"}


def expected(upto: int) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for record in RECORDS[: upto + 1]:
        for key, value in tracker_metrics(record).items():
            out.setdefault(key, {})[record["step"]] = value
    return out


def test_keys_are_slash_namespaced_and_only_finite_numbers_go():
    got = tracker_metrics({"step": 3, "policy_version": 3, "effective_ratio": 0.5, "weight_sync_seconds": 0.2,
                           "value_explained_variance": float("nan"), "value_loss": 0.01, "eval_accuracy": 0.4,
                           "suite_aime24": 0.1, "suite_average": 0.1, "selected_value_mean": None,
                           "generation_rounds": 1, "note": "text", "flag": True})
    assert got == {"pcl/effective_ratio": 0.5, "timing_s/weight_sync": 0.2, "value/loss": 0.01,
                   "eval/held_out": 0.4, "eval/aime24": 0.1, "eval/average": 0.1, "pcl/generation_rounds": 1.0}


def test_jsonl_is_always_on_and_an_unknown_backend_is_named():
    assert load_config(TINY).logging.backends == ["console", "jsonl"]
    assert load_config(TINY, ["logging.backends=[wandb]"]).logging.backends == ["jsonl", "wandb"]
    with pytest.raises(ConfigError, match="logging.backends"):
        load_config(TINY, ["logging.backends=[neptune]"])


def test_the_config_sent_to_trackers_holds_no_secret():
    token = "Zq8vK2mW5rT9xB4nL7pC1dF6gH3jS0aE"  # 32 characters, no placeholder
    cfg = load_config(TINY, ["control.token=" + token, "redis.url=redis://:hunter2secret@10.0.0.5:6379/0",
                             "logging.mlflow_tracking_uri=https://me:pw-secret@mlflow.example:5000"])
    config = flat_config(cfg)
    text = json.dumps(config)
    assert token not in text and "hunter2secret" not in text and "pw-secret" not in text
    assert config["redis.url"] == "redis://:***@10.0.0.5:6379/0" and config["selection.tau"] == 0.5


def test_a_named_tracker_that_is_not_installed_stops_the_run_before_anything_starts(monkeypatch, tmp_path):
    import ray

    from entrypoints.train import run_training

    monkeypatch.setitem(tracking.LIBRARIES, "wandb", ("pcl_test_no_such_module", "wandb"))
    cfg = load_config(TINY, ["logging.backends=[console,wandb,tensorboard]"])
    with pytest.raises(ConfigError) as err:
        check_backends(cfg)
    assert "wandb" in str(err.value) and "pip install 'pcl-service[wandb]'" in str(err.value)
    assert "tensorboard" not in str(err.value)  # installed: not named
    with pytest.raises(ConfigError, match=r"pcl-service\[wandb\]"):
        run_training(cfg, run_dir=str(tmp_path / "run"))
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


def run_trackers(backend: str, run_dir: Path, project: str) -> str:
    """Steps 0-3 of RECORDS with a retune at step 2, then a resumed run sending 2-5 again (2 and 3 are already
    there) and finishing with a summary; returns the tracker run id."""
    cfg = load_config(TINY, [f"logging.backends=[{backend}]", f"logging.project={project}",
                                            "run.name=trk"])
    first = Trackers.open(cfg, run_dir)
    assert [first.commit(r) for r in RECORDS[:3]] == [True] * 3
    first.event(2, "params_applied", {"tau": 0.4, "previous": {"tau": 0.5}})  # takes effect from step 3
    assert first.commit(RECORDS[3])
    first.close()
    run_id = first.state["ids"][backend]
    resumed = Trackers.open(cfg, run_dir, resume=True)
    assert resumed.state["ids"][backend] == run_id
    assert [resumed.commit(r) for r in RECORDS[2:]] == [False, False, True, True]
    resumed.finish({"eval_accuracy_final": 0.5, "effective_ratio_mean": 0.53, "steps": 5, "elapsed_seconds": None})
    return run_id


def values(stored: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    """{key: {step: value}}, asserting no step of any key holds two values."""
    out = {}
    for key, steps in stored.items():
        for step, vals in steps.items():
            assert len(vals) == 1, f"{key} written {len(vals)} times at step {step}: {vals}"
        out[key] = {step: vals[0] for step, vals in steps.items()}
    return out


def assert_same_series(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]]) -> None:
    assert set(got) == set(want) == EXPECTED_KEYS
    for key, steps in want.items():
        assert got[key] == pytest.approx(steps, rel=1e-6), key


def test_tensorboard_event_files_hold_every_step_once(tmp_path):
    run_trackers("tensorboard", tmp_path, "p")
    log_dir = tmp_path / "tensorboard"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 2  # the resumed run's file beside the first's
    assert_same_series(values(read.tensorboard_scalars(log_dir)), expected(5))
    texts = read.tensorboard_texts(log_dir)
    assert any("selection.tau" in t and "| 0.5 |" in t for t in texts["config"])
    assert any("tau=0.4" in t for t in texts["events/params_applied"])
    assert any("eval_accuracy_final" in t for t in texts["summary"])


def test_mlflow_local_store_holds_one_run_with_every_step_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_id = run_trackers("mlflow", run_dir, "p")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (run_dir / "mlflow-artifacts").is_dir()
    runs = read.mlflow_runs(f"sqlite:///{run_dir / 'mlflow.db'}", "p")
    assert list(runs) == [run_id]
    run = runs[run_id]
    summary = {k: v for k, v in run["metrics"].items() if k.startswith("summary/")}
    assert_same_series(values({k: v for k, v in run["metrics"].items() if k not in summary}), expected(5))
    assert values(summary) == {"summary/eval_accuracy_final": {5: 0.5}, "summary/effective_ratio_mean": {5: 0.53},
                               "summary/steps": {5: 5.0}}
    assert run["params"]["selection.tau"] == "0.5" and run["params"]["run.m"] == "64"
    assert "control.token" not in run["params"]
    assert any("tau=0.4" in v for k, v in run["tags"].items() if k.startswith("event.000002.params_applied"))
    assert run["status"] == "FINISHED"


def test_wandb_offline_run_files_hold_one_run_with_every_step_once(tmp_path, monkeypatch):
    read.offline_env(monkeypatch)
    run_id = run_trackers("wandb", tmp_path, "p")
    runs = read.wandb_offline_runs(tmp_path / "wandb")
    assert list(runs) == [run_id] and runs[run_id]["files"] == 2  # the resumed run continues the same id
    run = runs[run_id]
    events = run["history"].pop("events/params_applied")
    assert list(events) == [3]  # sent with the next step committed after the retune
    assert "tau=0.4" in events[3][0]["file"].read_text()
    assert_same_series(values(run["history"]), expected(5))
    assert run["config"]["selection.tau"] == 0.5
    assert run["summary"]["summary/eval_accuracy_final"] == 0.5


def test_trackio_local_database_holds_one_run_with_every_step_once(tmp_path, monkeypatch):
    read.offline_env(monkeypatch)
    project = f"pcl-test-{uuid.uuid4().hex[:8]}"
    run_id = run_trackers("trackio", tmp_path, project)
    runs = read.trackio_runs(project)
    assert list(runs) == [run_id]
    assert_same_series(values(runs[run_id]), expected(5))


@pytest.mark.redis
def test_control_events_are_relayed_once_each_across_a_resume(store, tmp_path):  # noqa: F811 - the fixture
    """tau / k retunes and pauses in the control state's event log (a real Redis) reach the tracker at the step
    they took effect, each once, also when the run is resumed; other events are not relayed."""
    cfg = load_config(TINY, ["logging.backends=[tensorboard]"])
    first = Trackers.open(cfg, tmp_path)
    first.commit(RECORDS[0])
    store.add_event("params_applied", "coordinator", step=1, tau=0.4, previous={"tau": 0.5})
    store.add_event("heartbeat_lost", "driver")
    first.relay(store)
    first.relay(store)  # nothing new
    first.close()
    resumed = Trackers.open(cfg, tmp_path, resume=True)
    store.add_event("paused", "coordinator", step=2)
    resumed.relay(store)
    resumed.close()
    texts = read.tensorboard_texts(tmp_path / "tensorboard")
    assert texts["events/params_applied"] == ["params_applied previous={'tau': 0.5} tau=0.4"]
    assert texts["events/paused"] == ["paused"]
    assert "events/heartbeat_lost" not in texts


def test_a_tracker_that_fails_mid_run_is_reported_and_training_goes_on(tmp_path, capsys):
    cfg = load_config(TINY, ["logging.backends=[tensorboard]"])
    trackers = Trackers.open(cfg, tmp_path)
    assert trackers.commit(RECORDS[0])
    trackers.adapters["tensorboard"].writer.close()
    trackers.adapters["tensorboard"].writer.flush = None  # its writer gone, as with a full disk: the call raises
    assert trackers.commit(RECORDS[1]) and trackers.commit(RECORDS[2])
    err = capsys.readouterr().err
    assert err.count("pcl: warning: tracker tensorboard: log failed") == 1 and "training goes on" in err
    assert trackers.last_step == 2 and trackers.failures == {"tensorboard": 2}


def test_each_library_is_imported_only_when_named(tmp_path):
    """A fresh interpreter: the driver's modules and a TensorBoard-only run import none of the other trackers."""
    import subprocess
    import sys

    code = f"""
import sys
import entrypoints.train, services.tracking.trackers, entrypoints.cli
from pcl.config import load_config
from services.tracking.trackers import Trackers
libraries = ("tensorboard", "wandb", "mlflow", "trackio")
before = [m for m in libraries if m in sys.modules]
Trackers.open(load_config({TINY!r}, ["logging.backends=[tensorboard]"]), {str(tmp_path)!r}).close()
print(before, [m for m in libraries if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(TINY).parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[] ['tensorboard']"


def test_a_tracker_that_cannot_start_is_a_configuration_error(tmp_path):
    """MLflow pointed at a store it cannot open (a file where its directory should be): a ConfigError naming
    the tracker."""
    (tmp_path / "taken").write_text("a file")
    cfg = load_config(TINY, ["logging.backends=[tensorboard,mlflow]",
                             f"logging.mlflow_tracking_uri=sqlite:///{tmp_path}/taken/mlflow.db"])
    with pytest.raises(ConfigError, match="logging.backends: mlflow could not start its run"):
        Trackers.open(cfg, tmp_path)


def test_records_written_but_never_sent_are_sent_when_the_run_goes_on(tmp_path):
    """The driver wrote steps 4 and 5 to metrics.jsonl, a checkpoint took them, and the driver was killed before it
    sent them to the trackers: the resumed driver sends them before it goes on (each once), as `pcl train` does
    at every start (`entrypoints.train.logged_records`). Before, the resumed run went on from step 6 and the
    trackers never had 4 and 5."""
    from entrypoints.train import logged_records
    from pcl.loop.runlog import MetricsLog

    cfg = load_config(TINY, ["logging.backends=[tensorboard]", "run.name=trk"])
    first = Trackers.open(cfg, tmp_path)
    log = MetricsLog(tmp_path)
    for record in RECORDS[:4]:
        log.append(record)
        assert first.commit(record)
    log.append(RECORDS[4])
    log.append(RECORDS[5])  # written, then the driver was killed
    first.close()
    resumed = Trackers.open(cfg, tmp_path, resume=True)
    assert resumed.catch_up(logged_records(tmp_path)) == 2 and resumed.last_step == 5
    assert resumed.catch_up(logged_records(tmp_path)) == 0  # each once
    resumed.close()
    stored = values(read.tensorboard_scalars(tmp_path / "tensorboard"))
    assert sorted(stored["pcl/effective_ratio"]) == [1, 2, 3, 4, 5]  # step 0 is an evaluation
