"""The docker-compose deployment as the deployment tests drive it: one compose project of the cpu profile of its own
(free 127.0.0.1 ports, fresh secrets), brought up after `deploy/build.sh` and torn down with its volumes; requests
to what it publishes on 127.0.0.1; Ray's state API on the head's published dashboard port.

    with compose_cluster("head", timings) as d:      # build, `up --wait`, ... `down -v`
        d.compose("exec", "-T", "redis", "redis-cli", "ping")
        nodes = state(d, "nodes")
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.ray_cluster import free_port

REPO = Path(__file__).resolve().parents[2]


def sh(*args: str, timeout: float = 120, check: bool = True, env: dict | None = None,
       input_text: str | None = None) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO, input=input_text)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


class Deployment:
    """One compose project of the cpu profile, on free 127.0.0.1 ports, with fresh secrets."""

    def __init__(self, name: str = "") -> None:
        self.project = f"pcltest{name}{os.getpid()}"
        self.ports = {name: free_port() for name in
                      ("PCL_CONTROL_PORT", "RAY_DASHBOARD_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT")}
        self.secrets = {"PCL_API_TOKEN": secrets.token_hex(16), "REDIS_PASSWORD": secrets.token_hex(16),
                        "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_GCS_REDIS_PASSWORD": secrets.token_hex(16),
                        "GRAFANA_ADMIN_PASSWORD": secrets.token_hex(16)}
        self.env = {**os.environ, **{k: str(v) for k, v in self.ports.items()}, **self.secrets}

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        return sh("docker", "compose", "-p", self.project, "--profile", "cpu", *args, timeout=timeout,
                  check=check, env=self.env)

    def url(self, name: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}{path}"

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip()

    def ip(self, service: str) -> str:
        return sh("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                  self.container(service)).strip()

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        return {"containers": sh("docker", "ps", "-aq", "--filter", label).split(),
                "networks": sh("docker", "network", "ls", "-q", "--filter", label).split(),
                "volumes": sh("docker", "volume", "ls", "-q", "--filter", label).split()}

    def down(self) -> None:
        sh("docker", "compose", "-p", self.project, "--profile", "cpu", "--profile", "grafana", "down", "-v",
           "--remove-orphans", "--timeout", "5", timeout=180, check=False, env=self.env)


@contextlib.contextmanager
def compose_cluster(name: str, timings: dict[str, float]) -> Iterator[Deployment]:
    """The images built (deploy/build.sh, printed), the cpu profile up and healthy as project `name`; down with its
    volumes after, whatever happened. Fails, naming what is missing, without a Docker engine or Compose v2."""
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode:
        pytest.fail("make test-deploy needs a running Docker engine (docs/deploy.md, Testing the deployment)")
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode:
        pytest.fail("make test-deploy needs Docker Compose v2 (`docker compose`)")
    started = time.monotonic()
    build = subprocess.run(["deploy/build.sh"], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert build.returncode == 0, build.stderr[-5000:]
    timings["build_s"] = time.monotonic() - started
    print("\n" + build.stdout.strip())
    d = Deployment(name)
    try:
        started = time.monotonic()
        d.compose("up", "-d", "--wait", "--no-build", timeout=600)
        timings["up_s"] = time.monotonic() - started
        yield d
    finally:
        started = time.monotonic()
        d.down()
        timings.setdefault("down_s", time.monotonic() - started)


def http(url: str, method: str = "GET", token: str | None = None, body: dict | None = None) -> tuple[int, str]:
    """(status, body) of one request to 127.0.0.1; errors are statuses, not exceptions."""
    assert url.startswith("http://127.0.0.1:"), url
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return 0, str(exc)


def state(d: Deployment, what: str) -> list[dict]:
    """Ray's state API (`/api/v0/actors`, `/api/v0/nodes`) on the head's published dashboard port."""
    status, body = http(d.url("RAY_DASHBOARD_PORT", f"/api/v0/{what}?detail=1&limit=10000"),
                        token=d.secrets["RAY_AUTH_TOKEN"])
    assert status == 200, (what, status, body[:500])
    data = json.loads(body)["data"]["result"]
    return data["result"] if isinstance(data, dict) else data


def alive_resources(d: Deployment) -> set[str]:
    """The resources the cluster's alive nodes offer; none while the head's API does not answer yet."""
    try:
        return {r for n in state(d, "nodes") if n["state"] == "ALIVE" for r in n["resources_total"]}
    except AssertionError:
        return set()


def wait_for_workers(d: Deployment, timeout_s: float = 600) -> float:
    """Seconds until both worker containers' nodes are alive in the cluster (on a busy host a worker's first start
    can time out; its restart policy retries)."""
    started, deadline = time.monotonic(), time.monotonic() + timeout_s
    while not {"rollout", "learner"} <= alive_resources(d):
        assert time.monotonic() < deadline, "the worker containers never joined the head"
        time.sleep(2)
    return time.monotonic() - started


def run_dir_steps(d: Deployment, run_dir: str = "/runs/tiny") -> list[int]:
    """The steps the run in `run_dir` (on the runs volume) has logged, read on the head."""
    out = d.compose("exec", "-T", "ray-cpu-head", "cat", f"{run_dir}/metrics.jsonl", check=False)
    return [r["step"] for r in (json.loads(line) for line in out.splitlines() if line.strip())
            if "effective_ratio" in r]
