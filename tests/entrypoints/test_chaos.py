"""`pcl chaos`: what it refuses before anything starts (default suite), and a short chaos run end to end (slow: a
tiny-carry run under 4 faults, then its invariants, the reference run and the report)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoints.chaos import chaos_config
from pcl.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("override, needle", [
    ("redis.url=redis://127.0.0.1:6379/0", "embedded Redis"),
    ("control.enabled=false", "control.enabled"),
    ("run.time_budget_s=60", "fixed step count"),
    ("redis.appendonly=false", "redis.appendonly"),
])
def test_a_config_chaos_cannot_run_is_refused_naming_the_setting(override, needle):
    with pytest.raises(ConfigError, match=needle):
        chaos_config(["configs/chaos.yaml"], [override], seed=0)


def test_the_seed_is_the_runs_seed():
    cfg, overrides = chaos_config(["configs/chaos.yaml"], ["run.steps=7"], seed=11)
    assert cfg.run.seed == 11 and cfg.run.steps == 7 and overrides[-1] == "run.seed=11"
    assert cfg.rollout.num_workers == 2 and cfg.rollout.deterministic and cfg.run.time_budget_s is None
    assert cfg.checkpoint.max_restarts > 12 and cfg.redis.visibility_timeout_s <= 5
    assert "tensorboard" in cfg.logging.backends  # offline: the trackers invariant reads its event files


def test_an_existing_output_is_not_overwritten(tmp_path):
    (tmp_path / "run").mkdir()
    done = subprocess.run([sys.executable, "-m", "entrypoints.cli", "chaos", "configs/chaos.yaml", "--faults", "2",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a new --out directory" in done.stderr


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.redis
def test_a_short_chaos_run_keeps_every_invariant(tiny_model, tmp_path):
    """Seed 40, 4 faults over 30 s: a malformed entry in each stream, Redis filled to its cap, a rollout worker
    SIGKILLed, a process SIGKILLed during a weight sync; a tau retune, a checkpoint request, a pause and its resume;
    12 steps, then the reference run (the retune replayed) compared weight for weight. About 4 minutes on 2 cores."""
    args = [sys.executable, "-m", "entrypoints.cli", "chaos", "configs/chaos.yaml", "--seed", "40", "--faults", "4",
            "--window", "30", "--out", str(tmp_path), "--reference", "run.steps=12", "checkpoint.every=3",
            "run.eval_every=0"]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1800)
    report = json.loads((tmp_path / "run" / "chaos_report.json").read_text())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert report["passed"] and all(c["status"] == "PASS" for c in report["checks"]), report["checks"]
    assert {f["kind"] for f in report["faults"] if f["injected_s"] is not None} == {
        "malformed", "redis_full", "kill_rollout", "weight_sync"}
    assert {c["name"] for c in report["checks"]} == {"processes", "steps", "batches", "versions", "trackers", "streams",
                                                     "incarnations", "stale results", "control", "weights"}
    assert "result: PASS" in done.stdout


def test_the_default_window_fits_the_run_and_a_reference_measures_its_pace(tmp_path):
    from entrypoints.chaos import STEP_S, default_window

    cfg, _ = chaos_config(["configs/chaos.yaml"], ["run.steps=40"], seed=2)
    window, why = default_window(cfg, tmp_path)
    assert window < 40 * STEP_S and "estimate" in why  # not 40 s a fault: 6 faults would be 240 s
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "effective_ratio": 0.5, "elapsed_seconds": 3.0 * s}) + "\n" for s in range(1, 41)))
    window, why = default_window(cfg, tmp_path)
    assert window < 40 * 3.0 and str(tmp_path / "reference") in why
    assert default_window(cfg, tmp_path, step_s=1.0)[0] < 40 * 1.0


def test_faults_the_run_ended_before_are_reported_not_injected():
    import time
    from types import SimpleNamespace

    from entrypoints.chaos.faults import Injector
    from pcl.tools.chaos_report import build_report, format_report
    from pcl.tools.chaos_schedule import Fault, Schedule

    schedule = Schedule(0, 60.0, (Fault(0, "kill_rollout", 5000.0), Fault(1, "malformed", 6000.0)))
    injector = Injector(schedule, SimpleNamespace(clock=time.monotonic))
    injector.start(time.monotonic())
    injector.stop()  # the run ended before either fault's time
    assert [r["note"] for r in injector.results] == ["not injected (run ended)"] * 2
    report = build_report(schedule, injector.results, [], {"finished": True}, 0, "pcl chaos ...")
    assert report["not_injected"] == {"run_ended": 2, "other": 0} and not report["passed"]
    assert "injected: 0 of 2 faults; 2 not injected (run ended): the 60 s window outlasted the run" in format_report(
        report, schedule)


def test_a_step_two_drivers_wrote_to_tensorboard_is_read_twice(tmp_path):
    """A SIGKILLed driver and its --resume write two event files into RUN_DIR/tensorboard: read raw, a step both
    sent shows twice (TensorBoard's accumulator would keep one of them)."""
    from torch.utils.tensorboard import SummaryWriter

    from entrypoints.chaos.final import read_tracker_steps
    from pcl.tools.chaos_checks import check_trackers

    assert read_tracker_steps(tmp_path) is None
    for steps in ([1, 2, 3], [3, 4]):  # the resumed driver sends step 3 again
        writer = SummaryWriter(log_dir=str(tmp_path / "tensorboard"))
        for step in steps:
            writer.add_scalar("pcl/effective_ratio", 0.5, global_step=step)
        writer.add_text("events/paused", "paused", global_step=steps[0])  # annotations are no figures
        writer.close()
        time.sleep(1.1)  # event file names hold the time in seconds
    scalars = read_tracker_steps(tmp_path)
    assert sorted(scalars["pcl/effective_ratio"]) == [1, 2, 3, 3, 4] and set(scalars) == {"pcl/effective_ratio"}
    result = check_trackers(scalars, 4)
    assert result.ok is False and "steps written twice: 3" in result.detail


@pytest.mark.redis
@pytest.mark.parametrize("appendonly", [True, False])
def test_the_final_reading_of_the_runs_redis_balances_its_counts_and_finds_nothing_without_its_aof(tmp_path,
                                                                                                  appendonly):
    """The run's embedded Redis, stopped, is read from its data directory: with its append-only file the streams,
    their groups and the entry counts are all there and balance (a malformed entry injected and dead-lettered);
    without it the database is empty, which fails the check rather than reading as 0 pending."""
    from entrypoints.chaos.final import read_redis
    from pcl.tools.chaos_checks import MALFORMED_MARK, check_streams
    from services.redis_server import start_embedded
    from services.streams.counts import inject
    from services.streams.topology import STREAMS, open_queue
    from tests.services.test_queues import request

    with start_embedded(tmp_path / "redis", appendonly=appendonly) as handle:
        for stream in STREAMS:
            queue = open_queue(handle.client(), "chaos", stream.name, f"{stream.consumer}-0", block_ms=20)
            queue.put([request(f"p{i}") for i in range(3)])
            inject(queue.client, queue.stream, b"\x94\x04" + MALFORMED_MARK + b":0:x")
            queue.ack(queue.take(10))  # the malformed entry is dead-lettered on the way
            queue.trim_committed()
    streams, dead = read_redis(tmp_path / "redis", "chaos")
    result = check_streams(streams, dead)
    if appendonly:
        assert result.ok, result.detail
        assert len(dead) == 3 and all(s["counts"]["put"] == 3 and s["counts"]["dead"] == 1 for s in streams.values())
    else:
        assert result.ok is False and "rollout_requests: the stream is missing" in result.detail, result.detail


@pytest.mark.redis
def test_the_control_traffic_records_what_each_request_expected_and_a_real_control_plane_answers_so(tmp_path):
    """Against a real control plane (uvicorn, an embedded Redis, a run publishing its state): the requests that must
    be refused are refused with the status each expected (a wrong token 401, a bad body 422, a resume while not
    paused 409, and while a pause of ours is in effect a k above k_max 409), the scheduled actions answered 202,
    each request recorded in the file the `control` check reads; the check passes them against the run's events."""
    from types import SimpleNamespace

    from entrypoints.chaos.final import read_requests
    from entrypoints.chaos.traffic import ControlTraffic
    from pcl.strategies.prompt_curriculum import PCLStrategy
    from pcl.tools.chaos_checks import check_control
    from pcl.tools.chaos_schedule import Action
    from services.control.api import create_app
    from services.control.run import RunControl
    from services.control.server import ControlServer
    from services.control.store import ControlStore
    from services.redis_server import start_embedded

    token = "chaos-traffic-test-token-0123456789abcdef"
    with start_embedded(tmp_path / "redis", appendonly=False) as handle:
        store = ControlStore(handle.client(decode_responses=True), "chaos")
        store.set_k_max(16)
        control = RunControl(store, steps_total=10, poll_s=0.02)  # its heartbeat thread ends with finish() below
        control.at_step_boundary(0, PCLStrategy(m=8, n=4, tau=0.5, k=4))
        server = ControlServer(create_app(store, token), "127.0.0.1", 0).start()
        try:
            run = SimpleNamespace(driver=SimpleNamespace(control_url=server.url, state="up"), clock=time.monotonic,
                                  control_up=lambda: True, phase=lambda: "rollout")
            traffic = ControlTraffic(run, token, tmp_path / "requests.jsonl")
            traffic.t0 = time.monotonic()
            for n in range(3):
                traffic._refused(n)
            assert traffic._act(Action(0.0, "pause")) and traffic.paused
            traffic._refused(2)  # a pause of ours in effect: the conflict is a k above k_max
            assert traffic._act(Action(0.0, "tau", 0.4)) and traffic._act(Action(0.0, "resume"))
            traffic.request("GET", "/v1/status")
        finally:
            server.stop()
            control.finish(0)
    recorded = read_requests(tmp_path / "requests.jsonl")
    assert [(r["what"], r["expect"], r["status"]) for r in recorded] == [
        ("pause with a wrong token", [401], 401), ("params with a bad body", [422], 422),
        ("resume while not paused", [409], 409), ("pause", [202], 202), ("k above k_max", [409], 409),
        ("tau", [202], 202), ("resume", [202], 202), ("GET /v1/status", [200], 200)]
    assert all(r["sent"] <= r["answered"] for r in recorded) and not traffic.paused
    result = check_control(recorded, [])
    assert result.ok and "refused: 1 x 401, 2 x 409, 1 x 422" in result.detail, result.detail


def test_a_driver_the_chaos_run_gives_up_on_counts_as_down(tmp_path):
    """At its deadline the chaos run kills the driver's process group: a control-plane request cut off then was cut
    off by the chaos run, while the driver was down, not unanswered by a live driver (seed 17 under a load of 30)."""
    import os

    from entrypoints.chaos.driver import Driver

    driver = Driver([sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "run", dict(os.environ),
                    tmp_path / "driver.log", time.monotonic)
    driver.start()
    driver.state = "up"  # as the milestones of its output would have it
    driver.stop()
    assert driver.state == "down" and driver.poll() is not None
    driver.close()
