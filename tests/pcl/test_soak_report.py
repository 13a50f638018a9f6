"""The soak report on synthetic samples (pcl/tools/soak_fit.py, soak_report.py, soak_text.py): slopes and their
intervals against known lines, the projections to 72 hours, and the verdicts: a leak is found, a flat process
passes, a run too short to tell is unresolved, a sawtooth is bounded, the history's bytes per record and its cap,
bytes per step of the per-step records."""

from __future__ import annotations

import math
import random

import pytest

from pcl.tools.soak_fit import fit_slope, lag1, t95
from pcl.tools.soak_report import GOALS, HOURS, PRESET_STEPS, Facts, build_report
from pcl.tools.soak_text import format_report

MB = 1e6
FACTS = Facts(m=64, n=8, checkpoint_every=200, checkpoint_keep=2, history_cap=50_000, events_cap=10_000,
              bounds={"checkpoints/": "checkpoint.keep=2"}, ray_rotation_bytes=64 << 20, ray_rotation_backups=2)


def test_t_quantiles_match_the_table():
    for dof, table in ((3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042), (1000, 1.962)):
        assert t95(dof) == pytest.approx(table, rel=0.01)


def test_a_known_line_is_found_within_its_interval():
    rng = random.Random(0)
    xs = [i / 10 for i in range(200)]
    ys = [5.0 + 2.0 * x + rng.gauss(0, 1) for x in xs]
    fit = fit_slope(xs, ys)
    assert fit.low < 2.0 < fit.high and fit.slope == pytest.approx(2.0, abs=0.15)
    assert fit.intercept == pytest.approx(5.0, abs=0.5)
    assert fit.judge(scale=10, limit=10) == "grows" and fit.judge(scale=10, limit=40) == "flat"


def test_autocorrelated_noise_widens_the_interval():
    rng = random.Random(1)
    walk, level = [], 0.0
    for _ in range(300):
        level = 0.95 * level + rng.gauss(0, 1)  # memory moves in runs, not independently each sample
        walk.append(level)
    xs = list(range(300))
    fit = fit_slope(xs, walk)
    assert lag1([w - sum(walk) / 300 for w in walk]) > 0.7
    assert fit.n_eff < 60  # far fewer than 300 independent samples
    naive_half = t95(298) * math.sqrt(sum((y - fit.intercept - fit.slope * x) ** 2 for x, y in zip(xs, walk))
                                      / 298 / sum((x - 149.5) ** 2 for x in xs))
    assert fit.high - fit.slope > 2 * naive_half


def test_a_fit_needs_three_samples_and_two_times():
    with pytest.raises(ValueError, match="at least 3"):
        fit_slope([0, 1], [0, 1])
    with pytest.raises(ValueError, match="same x"):
        fit_slope([1, 1, 1], [0, 1, 2])


def _samples(hours: float = 3.0, every_s: float = 60.0, leak_mb_per_h: float = 0.0, seed: int = 0) -> list[dict]:
    """A run at 7,200 steps an hour: a flat process, one leaking, threads and fds flat, Redis with a growing
    history, a per-step file, a sawtooth AOF and a rotating checkpoint folder, the control plane's answers."""
    rng = random.Random(seed)
    out = []
    for i in range(int(hours * 3600 / every_s) + 1):
        t = i * every_s
        step = int(t * 2)
        history = min(step, 50_000)
        out.append({
            "t": t, "step": step,
            "procs": {"gcs_server": [int(60 * MB + leak_mb_per_h * MB * t / 3600 + rng.gauss(0, 0.2 * MB)), 20, 40],
                      "driver": [int(600 * MB + rng.gauss(0, 0.5 * MB)), 30, 80],
                      "redis-server": [int(10 * MB + 1500 * history), 5, 12]},
            "redis": {"used_memory": int(2 * MB + 1500 * history + rng.gauss(0, 1000)), "maxmemory": 6_000 * MB,
                      "history_records": history, "history_bytes": 1500 * history,
                      "streams": {"rollout_requests": rng.randrange(0, 64), "events": min(i, 10_000)}},
            "files": {"metrics.jsonl": 1300 * step, "redis/appendonly.aof": int(20 * MB + (t % 900) * 0.1 * MB),
                      "checkpoints/": int(35 * MB * (1 + (step // 200 > 0) + (step % 200 > 100))),
                      "checkpoints/#": 2},
            "ray": {"session/": int(5 * MB), "logs/": int(4 * MB), "logs/raylet.out": int(3 * MB),
                    "logs/gcs_server.out": int(1 * MB)},
            "control": {"/v1/history?limit=1000": [1_500_000, 0.2], "/metrics": [20_000, 0.02]},
        })
    return out


def test_a_flat_run_passes_and_a_leak_is_found():
    run = {"ended": "finished", "minutes": 180, "traffic": {"requests": 10, "by_status": {"200": 10},
                                                             "unexpected": []}}
    samples = _samples()
    ending = [{**samples[-1], "t": samples[-1]["t"] + 60 * i, "state": "ending", "procs": {}} for i in (1, 2, 3)]
    flat = build_report(samples + ending, FACTS, run)  # the run's end, its processes leaving, is not judged
    assert flat["processes_changed"] == []
    rows = {(r["process"], r["resource"]): r for r in flat["processes"]}
    assert rows[("gcs_server", "rss")]["verdict"] == "flat" and rows[("driver", "threads")]["verdict"] == "flat"
    assert rows[("redis-server", "rss")]["verdict"] == "stated"  # judged by Redis' own memory
    assert flat["passed"], format_report(flat)
    assert "result: PASS" in format_report(flat)

    leak = build_report(_samples(leak_mb_per_h=5.0), FACTS, run)  # 5 MB/h: 360 MB over 72 h
    row = {(r["process"], r["resource"]): r for r in leak["processes"]}[("gcs_server", "rss")]
    assert row["verdict"] == "grows" and row["per_hour"][1] < 5 * MB < row["per_hour"][2]
    assert row["per_72h"][0] == pytest.approx(HOURS * 5 * MB, rel=0.05)
    assert row["per_1000_steps"][0] == pytest.approx(5 * MB / 7.2, rel=0.05)  # 7,200 steps an hour
    assert row["per_preset_run"][0] == pytest.approx(PRESET_STEPS / 1000 * 5 * MB / 7.2, rel=0.05)
    assert not leak["passed"] and "result: FAIL" in format_report(leak)


def test_a_short_noisy_run_is_unresolved_not_passed_as_flat():
    samples = _samples(hours=0.5, every_s=30.0, leak_mb_per_h=0.5, seed=3)
    for s in samples:  # a noisy process: RSS moves by tens of MB
        s["procs"]["driver"][0] += int(random.Random(s["t"]).gauss(0, 20 * MB))
    report = build_report(samples, FACTS, {"ended": "finished"}, warmup_s=300)
    row = {(r["process"], r["resource"]): r for r in report["processes"]}[("driver", "rss")]
    assert row["verdict"] == "unresolved"
    assert "unresolved" in format_report(report)


def test_redis_history_per_step_files_and_bounds():
    report = build_report(_samples(), FACTS, {"ended": "finished"})
    history = report["redis"]["history"]
    assert history["bytes_per_record"] == pytest.approx(1500)
    assert history["bytes_at_cap"] == pytest.approx(1500 * 50_000, rel=0.01)
    assert history["verdict"] == "bounded"  # 75 MB, under half of 6 GB
    assert report["redis"]["other_memory"]["verdict"] == "flat"
    assert history["hours_to_cap"] == pytest.approx((50_000 - 21_600) / 7200, rel=0.02)
    metrics = report["files"]["metrics.jsonl"]
    assert metrics["kind"] == "per step" and metrics["per_1000_steps"][0] == pytest.approx(1_300_000)
    assert report["files"]["redis/appendonly.aof"]["verdict"] == "bounded"
    assert report["files"]["checkpoints/"]["bound"] == "checkpoint.keep=2"
    assert report["files"]["checkpoints/"]["kind"] == "per step"  # each holds a copy of the records
    assert report["files"]["checkpoints/#"]["verdict"] == "bounded"
    assert report["redis"]["streams"]["events"]["verdict"] == "bounded"
    assert report["control"]["/metrics"]["verdict"] == "bounded"
    text = format_report(report)
    assert "1300 bytes a step" in text.replace(",", "") and "1500 bytes a record" in text


def test_a_file_that_climbs_is_not_bounded_and_the_history_cap_is_reported():
    samples = _samples(hours=8.0, every_s=120.0)
    for s in samples:
        s["files"]["ray.log"] = int(1 * MB + 3 * MB * s["t"] / 3600)
        s["redis"]["streams"]["rollout_results"] = int(s["t"] / 10)  # never trimmed: past 2 steps of m x n
    report = build_report(samples, FACTS, {"ended": "finished"})
    assert report["files"]["ray.log"]["verdict"] == "grows" and not report["passed"]
    assert report["redis"]["streams"]["rollout_results"]["verdict"] == "over bound"
    assert report["redis"]["streams"]["rollout_results"]["cap"] == 2 * 64 * 8
    history = report["redis"]["history"]
    assert history["cap_reached_at"]["step"] == pytest.approx(50_000, abs=300)
    assert history["after_cap"]["verdict"] == "bounded"


def test_a_client_whose_connections_climb_late_is_named():
    samples = _samples(hours=2.0)
    for s in samples:  # a pool that still grows with its load an hour in, and two at their size from the start
        late = s["t"] > 1.5 * 3600
        s["redis"]["clients"] = {"pcl-control": 8, "pcl-rollout-0": 2, "unnamed": 3 + late}
    report = build_report(samples, FACTS, {"ended": "finished"})
    clients = report["redis"]["clients"]
    assert clients["pcl-control"]["verdict"] == clients["pcl-rollout-0"]["verdict"] == "bounded"
    assert clients["unnamed"]["verdict"] == "grows" and not report["passed"]
    assert "connections of unnamed: 3 -> 4 (early max 3, late 4): grows" in format_report(report)


def test_too_few_samples_judge_nothing():
    report = build_report(_samples(hours=0.05, every_s=60), FACTS, {"ended": "finished"})
    assert not report["passed"] and "nothing can be judged" in format_report(report)


def test_goals_are_stated_in_the_report():
    text = format_report(build_report(_samples(), FACTS, {"ended": "finished"}))
    assert f"{GOALS['rss'] / MB:.1f} MB RSS" in text and f"{GOALS['threads']} threads" in text
