"""The control plane as its own process (`pcl control`) under hostile and heavy reads: a 200 MB unauthenticated
PATCH must not grow the server, and many status and metrics reads over a large backlog on the embedded Redis 6.2
must cost Redis a bounded amount of time (its depth count is a Lua XRANGE over the backlog)."""

from __future__ import annotations

import math
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from services.streams.topology import stream_key
from services.redis_server import make_client
from tests.services.control_fixtures import AUTH, TOKEN

pytestmark = pytest.mark.redis
REPO = Path(__file__).resolve().parents[2]
MB = 1 << 20


class ControlProcess:
    """`pcl control` serving `run` from `redis_url` on a free port; stopped on close()."""

    def __init__(self, redis_url: str, run: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "entrypoints.cli", "control", "--redis-url", redis_url, "--run", run,
             "control.port=0"],
            cwd=REPO, env={"PCL_API_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"}, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.url = ""
        deadline = time.monotonic() + 60
        while not self.url and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            assert line, "pcl control exited early"
            if match := re.search(r"control plane at (http://\S+)", line):
                self.url = match.group(1)
        assert self.url, "pcl control did not say where it listens"
        self.port = int(self.url.rsplit(":", 1)[1])

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


@pytest.fixture
def control_process(request) -> Iterator[ControlProcess]:
    url, run = request.param(request)
    process = ControlProcess(url, run)
    yield process
    process.close()


def _patch_200_mb_without_token(port: int) -> bytes:
    """Send a 200 MB PATCH /v1/params with no token as a client that streams its body regardless; the reply."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        sock.sendall(b"PATCH /v1/params HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (200 * MB))
        chunk = b"x" * MB
        sent = 0
        try:
            sock.sendall(chunk)
            sent += 1
        except OSError:  # the server already answered and closed
            pass
        sock.settimeout(5)
        try:
            reply = sock.recv(65536)
        except TimeoutError:  # the server is waiting for the body: send it all
            reply = b""
        sock.settimeout(60)
        try:
            while sent < 200:
                sock.sendall(chunk)
                sent += 1
        except OSError:  # the server closed the connection on its reply
            pass
        if not reply:
            reply = sock.recv(65536)
        return reply
    finally:
        sock.close()


@pytest.mark.parametrize("control_process", [lambda r: (r.getfixturevalue("redis_url"),
                                                         r.getfixturevalue("key_prefix"))],
                         indirect=True, ids=["session-redis"])
def test_a_200_mb_unauthenticated_patch_does_not_grow_the_server(control_process, redis_client):
    http = httpx.Client(base_url=control_process.url, timeout=60)
    for _ in range(5):  # warm: the first requests allocate what every request needs
        http.get("/v1/status")
        http.patch("/v1/params", json={"tau": 0.4})
        http.patch("/v1/params", json={"tau": 0.4}, headers=AUTH)
    before = control_process.rss_mb()
    reply = _patch_200_mb_without_token(control_process.port)
    time.sleep(0.5)
    after = control_process.rss_mb()
    status_line = reply.split(b"\r\n", 1)[0].decode(errors="replace")
    print(f"\nRSS of pcl control around a 200 MB unauthenticated PATCH: {before:.0f} MB -> {after:.0f} MB; "
          f"reply {status_line!r}")
    assert reply.startswith(b"HTTP/1.1 401 "), reply[:200]
    assert after - before < 20, (before, after)
    assert http.get("/livez").status_code == 200  # the server still serves


def _embedded_backlog(request) -> tuple[str, str]:
    """A run on the embedded Redis 6.2 whose rollout_results stream holds 1,500 undelivered 16 KB entries."""
    url, run = request.getfixturevalue("embedded_redis_url"), request.getfixturevalue("key_prefix")
    client = make_client(url)
    key = stream_key(run, "rollout_results")
    client.xgroup_create(key, "verifier", id="$", mkstream=True)
    pipe = client.pipeline(transaction=False)
    for i in range(1500):
        pipe.xadd(key, {b"d": bytes([i % 251]) * (16 << 10)})
    pipe.execute()
    request.addfinalizer(lambda: (client.delete(key), client.close()))
    return url, run


def _eval_stats(client) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_eval", {"calls": 0, "usec": 0})
    return int(stats["calls"]), int(stats["usec"])


@pytest.mark.parametrize("control_process", [_embedded_backlog], indirect=True, ids=["embedded-6.2"])
def test_status_and_metrics_reads_over_a_large_backlog_cost_bounded_redis_time(control_process,
                                                                               embedded_redis_url):
    client = make_client(embedded_redis_url)
    assert client.info("server")["redis_version"].startswith("6.")  # no consumer-group lag: the count runs
    http = httpx.Client(base_url=control_process.url, timeout=30)
    calls0, usec0 = _eval_stats(client)
    assert http.get("/v1/status").json()["queue_depths"]["rollout_results"] == 1500
    calls1, usec1 = _eval_stats(client)
    one_count_usec = usec1 / max(calls1, 1)  # the first count ran as the control plane took its first readings
    started = time.monotonic()
    for _ in range(40):
        assert http.get("/v1/status").status_code == 200
        assert 'stream="rollout_results"} 1500.0' in http.get("/metrics").text
    elapsed = time.monotonic() - started
    calls2, usec2 = _eval_stats(client)
    client.close()
    print(f"\n80 reads in {elapsed:.1f} s over 1,500 x 16 KB entries: {calls2 - calls1} depth counts, "
          f"{(usec2 - usec1) / 1e3:.1f} ms of Redis in EVAL (one count: {one_count_usec / 1e3:.1f} ms)")
    assert calls1 - calls0 <= 1 and calls1 >= 1  # one stream with a group on this run, counted once (at start)
    allowed = math.ceil(elapsed / 5.0) + 1  # control.depth_cache_s: one count per 5 s, however many reads
    assert calls2 - calls1 <= allowed, (calls2 - calls1, elapsed)
