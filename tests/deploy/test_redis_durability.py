"""The deployments' Redis keeps every write it acknowledged when it is killed (docs/deploy.md, "Redis persistence"):
a redis-server started with the compose file's own arguments (`--appendfsync always`: each write is on disk before
its reply), SIGKILLed while a writer adds stream entries as fast as it can, then started again on its data
directory: every entry whose XADD was answered is there, in order. The machine's redis-server (Debian bookworm's
7.0, the compose image's) when installed, else the embedded one's binary."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis
import yaml

from services.redis_server import redis_server_binary

pytestmark = pytest.mark.redis
REPO = Path(__file__).resolve().parents[2]
KILL_AFTER = 300  # acknowledged entries before the kill; the writer keeps writing until it


def compose_redis_args() -> list[str]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["redis"]["command"]


def start(data_dir: Path, port: int) -> subprocess.Popen:
    binary = shutil.which("redis-server") or str(redis_server_binary())
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
                                *compose_redis_args()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client, deadline = redis.Redis(port=port, socket_timeout=5), time.monotonic() + 60
    while True:
        try:
            if client.ping():
                return process
        except (redis.ConnectionError, redis.BusyLoadingError):
            assert process.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)


def test_the_deployments_redis_fsyncs_every_write_before_it_answers():
    """Both Redis servers of each deployment: the work streams' and Ray's own (the GCS' state)."""
    assert " ".join(compose_redis_args()).count("--appendfsync always") == 1
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert compose["gcs-redis"]["command"] == compose_redis_args()
    for name in ("redis.yaml", "gcs-redis.yaml"):
        kuberay = next(d for d in yaml.safe_load_all((REPO / "deploy" / "kuberay" / name).read_text())
                       if d["kind"] == "StatefulSet")
        assert kuberay["spec"]["template"]["spec"]["containers"][0]["args"] == compose_redis_args(), name


def test_a_sigkilled_deployment_redis_keeps_every_entry_it_acknowledged(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = start(tmp_path, port)
    try:
        assert redis.Redis(port=port).config_get("appendfsync") == {"appendfsync": "always"}
        acknowledged, enough = [], threading.Event()

        def write() -> None:
            client = redis.Redis(port=port, socket_timeout=5)
            try:
                while True:
                    acknowledged.append(client.xadd("pcl:durable:rollout_requests", {"payload": b"x" * 512}))
                    if len(acknowledged) >= KILL_AFTER:
                        enough.set()
            except (redis.ConnectionError, redis.TimeoutError):
                enough.set()  # the server is gone: what was answered before is what must survive

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        assert enough.wait(60) and len(acknowledged) >= KILL_AFTER, len(acknowledged)
        server.send_signal(signal.SIGKILL)  # mid-write: the writer is still adding entries
        server.wait(30)
        writer.join(30)
        server = start(tmp_path, port)
        kept = [entry_id for entry_id, _ in redis.Redis(port=port).xrange("pcl:durable:rollout_requests")]
        assert kept[:len(acknowledged)] == acknowledged, (len(kept), len(acknowledged))
    finally:
        server.kill()
        server.wait(30)
