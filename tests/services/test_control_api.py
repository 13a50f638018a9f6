"""The control plane's HTTP API on a real Redis server and a real uvicorn on an ephemeral port: auth, status
codes, the Prometheus text, the dashboard page, `pcl status` and `pcl control` as their own processes."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.control.api import create_app
from services.control.server import ControlServer
from services.control.server import format_status
from services.control.store import ControlStore
from services.control.metrics import METRICS
from services.redis_server import make_client
from tests.services.control_fixtures import AUTH, TOKEN, api, running, server, store  # noqa: F401 - fixtures

pytestmark = pytest.mark.redis
REPO = Path(__file__).resolve().parents[2]


def test_mutations_need_the_bearer_token(api, running):
    for method, path, body in [
        ("POST", "/v1/pause", None),
        ("POST", "/v1/resume", None),
        ("PATCH", "/v1/params", {"tau": 0.4}),
        ("POST", "/v1/checkpoint", None),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            r = api.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
    assert api.get("/v1/status").json()["pause_requested"] is False  # nothing happened


def test_pause_resume_params_and_checkpoint_with_status_codes(api, running, store):
    r = api.post("/v1/pause", headers=AUTH)
    assert r.status_code == 202 and r.json()["event"]["type"] == "pause_requested"
    assert api.post("/v1/pause", headers=AUTH).status_code == 409
    assert api.get("/v1/status").json()["state"] == "pausing"

    r = api.patch("/v1/params", json={"tau": 0.35, "k": 8}, headers=AUTH)
    assert r.status_code == 202 and r.json()["event"]["data"] == {"last_step": 2, "tau": 0.35, "k": 8}
    assert api.get("/v1/status").json()["pending_params"] == {"tau": 0.35, "k": 8}

    assert api.post("/v1/resume", headers=AUTH).status_code == 202
    assert api.post("/v1/resume", headers=AUTH).status_code == 409

    r = api.post("/v1/checkpoint", headers=AUTH)
    assert r.status_code == 202 and r.json()["request_id"] == store.desired().checkpoint["id"]
    assert api.post("/v1/checkpoint", headers=AUTH).status_code == 409
    events = api.get("/v1/events").json()
    assert [e["type"] for e in events] == [
        "pause_requested",
        "params_requested",
        "resume_requested",
        "checkpoint_requested",
    ]
    assert [e["type"] for e in api.get("/v1/events", params={"after": events[1]["id"]}).json()] == [
        "resume_requested",
        "checkpoint_requested",
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"tau": 1.5},
        {"tau": -0.1},
        {"k": 0},
        {"k": 2.5},
        {"k": "4"},
        {"k": True},
        {},
        {"tau": 0.5, "m": 3},
        {"tau": "NaN"},
    ],
)
def test_bad_params_are_422(api, running, body):
    r = api.patch("/v1/params", json=body, headers=AUTH)
    assert r.status_code == 422, (body, r.text)
    assert api.get("/v1/status").json()["pending_params"] == {}


def test_status_reports_step_params_metrics_depths_and_health(api, running):
    status = api.get("/v1/status").json()
    assert status["state"] == "running" and status["step"] == 2 and status["policy_version"] == 2
    assert (status["tau"], status["k"], status["paused"]) == (0.5, 4, False)
    assert status["last_step"]["effective_ratio"] == 0.5 and status["eval"] == {"step": 0, "accuracy": 0.125}
    assert set(status["queue_depths"]) == {"rollout_requests", "rollout_results", "rewards"}
    assert status["coordinator"]["alive"] is True
    table = format_status(status)
    assert re.search(r"^state\s+running$", table, re.M) and re.search(r"^step\s+2 / 10$", table, re.M)
    assert re.search(r"^effective_ratio\s+0\.500$", table, re.M)


def test_metrics_export_every_design_name_with_help(api, running):
    text = api.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, (kind, _) in METRICS.items():
        family = families[name.removesuffix("_total")]
        assert family.type == kind and family.documentation, name
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    run = running.store.run
    assert samples[("pcl_step", (("run", run),))] == 2
    assert samples[("pcl_samples_total", (("run", run),))] == 64
    assert samples[("pcl_step_seconds_bucket", (("le", "60.0"), ("run", run)))] == 1
    assert samples[("pcl_step_seconds_bucket", (("le", "120.0"), ("run", run)))] == 2
    assert samples[("pcl_step_seconds_count", (("run", run),))] == 2
    depths = {dict(labels)["stream"] for (name, labels) in samples if name == "pcl_queue_depth"}
    assert depths == {"rollout_requests", "rollout_results", "rewards"}
    assert TOKEN not in text


def test_health_docs_and_no_secret_anywhere(api, running):
    assert api.get("/livez").json() == {"live": True}
    assert api.get("/readyz").status_code == 200
    spec = api.get("/openapi.json").json()
    assert {
        "/v1/status",
        "/v1/pause",
        "/v1/resume",
        "/v1/params",
        "/v1/checkpoint",
        "/v1/events",
        "/metrics",
        "/livez",
        "/readyz",
        "/v1/history",
    } <= set(spec["paths"])
    assert api.get("/docs").status_code == 404  # control.docs is off by default (the Swagger UI loads a CDN)
    api.post("/v1/pause", headers=AUTH)
    for path in ("/v1/status", "/v1/events", "/v1/history", "/metrics", "/openapi.json"):
        assert TOKEN not in api.get(path).text, path


def test_readyz_is_503_when_redis_is_gone():
    dead = ControlStore(make_client("redis://127.0.0.1:1/0", decode_responses=True), "nowhere")
    server = ControlServer(create_app(dead, TOKEN, redis_wait_s=0.2), "127.0.0.1", 0).start()
    try:
        assert httpx.get(f"{server.url}/livez").status_code == 200
        assert httpx.get(f"{server.url}/readyz").status_code == 503
        assert httpx.get(f"{server.url}/v1/status").status_code == 503
    finally:
        server.stop()


def test_dashboard_page_is_self_contained(api):
    r = api.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "/v1/status" in page and "/v1/history" in page and "/v1/pause" in page
    assert "s.stale ?" in page  # a status read while Redis is unreachable is shown as such
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # no CDN, no external asset
    assert "<script src" not in page and "@import" not in page


def test_pcl_status_prints_a_table(api, running):
    out = subprocess.run(
        [sys.executable, "-m", "entrypoints.cli", "status", "--url", str(api.base_url)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"^step\s+2 / 10$", out.stdout, re.M) and "queue rollout_requests" in out.stdout
    down = subprocess.run(
        [sys.executable, "-m", "entrypoints.cli", "status", "--url", "http://127.0.0.1:1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 1 and "no control plane answers at http://127.0.0.1:1" in down.stderr


def test_pcl_control_serves_a_run_from_its_own_process(redis_url, running, store):
    env = {"PCL_API_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "entrypoints.cli",
            "control",
            "--redis-url",
            redis_url,
            "--run",
            store.run,
            "control.port=0",
        ],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "pcl control exited early"
            if match := re.search(r"control plane at (http://\S+)", line):
                url = match.group(1)
        assert url and TOKEN not in line
        assert httpx.get(f"{url}/v1/status").json()["step"] == 2
        assert httpx.post(f"{url}/v1/pause", headers=AUTH).status_code == 202
        assert store.desired().paused  # the same state the coordinator reads
    finally:
        proc.terminate()
        proc.wait(timeout=20)
