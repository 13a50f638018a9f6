"""deploy/grafana/pcl-dashboard.json and deploy/prometheus/prometheus.yml against what the control plane
exports: every series a panel queries exists in a real scrape, the Prometheus config is valid, and a real
Prometheus server (Debian's `prometheus`, skipped with the reason where absent) scrapes the control plane,
sees the values move, and evaluates every panel's query without error."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from services.control.metrics import METRICS
from tests.services.control_fixtures import api, running, server, step_record, store  # noqa: F401 - fixtures

pytestmark = pytest.mark.redis
REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "pcl-dashboard.json"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"


def panel_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return queries


def series_names(query: str) -> set[str]:
    return set(re.findall(r"\b(pcl_[a-z_]+)", query))


def as_instant(query: str) -> str:
    """A panel query with Grafana's variables filled in, runnable against the Prometheus HTTP API."""
    if query.startswith("label_values("):
        return query.removeprefix("label_values(").split(",")[0]
    return query.replace("$__rate_interval", "1m").replace("$run", ".*")


def test_every_series_a_panel_queries_is_exported(api, running):
    exported = {s.name for f in text_string_to_metric_families(api.get("/metrics").text) for s in f.samples}
    queried = set().union(*map(series_names, panel_queries()))
    assert queried and queried <= exported, sorted(queried - exported)
    covered = {re.sub(r"_(bucket|sum|count)$", "", name) for name in queried}
    assert {name for name in METRICS} <= covered, sorted(set(METRICS) - covered)  # a panel for every metric
    dashboard = json.loads(DASHBOARD.read_text())
    assert all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in dashboard["panels"])
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_prometheus_config_scrapes_the_control_plane_and_ray():
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["pcl-control-plane"]["metrics_path"] == "/metrics"
    assert jobs["ray"]["file_sd_configs"][0]["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool not installed (Debian package prometheus): syntax not checked by Prometheus itself"
        )
    out = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_real_prometheus_scrapes_the_control_plane(server, running, store, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (apt-get install prometheus): no real-server scrape")
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "pcl-control-plane")
    job["static_configs"][0]["targets"] = [f"127.0.0.1:{server.port}"]
    job["scrape_interval"] = "1s"
    config["scrape_configs"] = [job]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/api/v1/query"

    def value(query: str) -> float | None:
        try:
            result = httpx.get(base, params={"query": query}, timeout=5).json()["data"]["result"]
        except (httpx.HTTPError, KeyError, ValueError):
            return None
        return float(result[0]["value"][1]) if result else None

    def wait_for(query: str, expected: float) -> None:
        deadline = time.monotonic() + 60
        while value(query) != expected:
            assert time.monotonic() < deadline and proc.poll() is None, f"{query} never became {expected}"
            time.sleep(0.25)

    try:
        run = store.run
        wait_for(f'pcl_step{{run="{run}"}}', 2)
        running.publish(step_record(3, step_seconds=2.0), 3)
        wait_for(f'pcl_step{{run="{run}"}}', 3)
        wait_for(f'pcl_step_seconds_count{{run="{run}"}}', 3)
        assert value(f'pcl_samples_total{{run="{run}"}}') == 96
        assert value('up{job="pcl-control-plane"}') == 1
        for query in panel_queries():  # valid PromQL, over series that exist
            response = httpx.get(base, params={"query": as_instant(query)}, timeout=5).json()
            assert response["status"] == "success", (query, response)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
