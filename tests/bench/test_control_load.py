"""bench/control_load.py end to end on a short tiny run (real Ray, embedded Redis, the control plane, HTTP
clients): the report has no errors, positive latencies for the endpoints and overall, steps counted in both
phases, and the no-op PATCH /v1/params accepted without changing tau. The 5% limit itself is the benchmark's
claim (docs/results/control-load.md), not asserted by a timed test."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.redis]


def test_control_load_bench_reports_latencies_and_both_phases(tiny_model, ray_session, tmp_path, capsys):
    from bench import control_load

    out = tmp_path / "report.json"
    figures = control_load.main([
        "--clients", "2", "--rate", "20", "--phase-steps", "3", "--rounds", "1", "--warmup-steps", "1",
        "--run-dir", str(tmp_path), "--json", str(out), "run.m=16", "run.n=4",
    ])
    report = json.loads(out.read_text())
    assert figures["exit_code"] == report["exit_code"] == 0, report
    assert report["training_exit"] == 0 and report["error_count"] == 0 and report["errors"] == {}
    assert report["config"]["steps"] == 1 + 2 * 3 + 1

    assert report["requests"] == sum(row["n"] for name, row in report["latency_ms"].items() if name != "all")
    assert report["requests"] == report["latency_ms"]["all"]["n"] > 0
    assert 0 < report["achieved_rate"] <= 20 * 1.1
    assert {"GET /v1/status", "GET /metrics", "GET /v1/events", PATCH := "PATCH /v1/params", "all"} <= set(
        report["latency_ms"]
    )
    for row in report["latency_ms"].values():
        assert 0 < row["p50"] <= row["p95"] <= row["p99"] <= row["max"]

    # The PATCH set tau to the value in force: accepted and logged, never applied.
    assert report["events"].get("params_requested", 0) == report["latency_ms"][PATCH]["n"]
    assert "params_applied" not in report["events"]
    assert report["taus_in_metrics"] == [report["tau"]] == [0.5]

    quiet, load = report["step_seconds"]["quiet"], report["step_seconds"]["load"]
    assert quiet["n"] == load["n"] == 2 and quiet["median"] > 0 and load["median"] > 0
    assert [s["phase"] for s in report["steps"]] == ["quiet"] * 3 + ["load"] * 3
    assert report["ratio"] == pytest.approx(load["median"] / quiet["median"])
    assert [r["ratio"] for r in report["rounds"]] == [pytest.approx(report["ratio"])]  # one round: the same
    cpu = report["cpu_cores"]
    assert cpu["load"]["process"] > cpu["load_clients"] > 0 and cpu["quiet"]["process"] > 0
    assert cpu["load"]["redis"] > 0  # the embedded Redis serves the control plane
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(report["verdict"]) and f"{report['ratio']:.3f}" in last
