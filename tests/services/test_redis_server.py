"""Connections: the embedded server's life cycle and durability, URL precedence, clear errors."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pcl.config import RedisConfig, load_config
from services.redis_server import RedisUnavailable, connect, make_client, masked, open_redis, ping, start_embedded

pytestmark = pytest.mark.redis
REPO = Path(__file__).resolve().parents[2]


def test_embedded_server_starts_with_aof_and_stops_on_close(tmp_path):
    handle = start_embedded(tmp_path / "redis", appendonly=True)
    assert handle.url == f"unix://{tmp_path / 'redis' / 'redis.sock'}"  # local clients use the Unix socket
    assert handle.tcp_url.startswith("redis://127.0.0.1:") and ping(handle.tcp_url)
    client = handle.client()
    assert client.ping()
    assert client.info("server")["redis_version"].startswith("6.2")
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("appendfsync") == {"appendfsync": "always"}
    assert client.config_get("auto-aof-rewrite-percentage") == {"auto-aof-rewrite-percentage": "100"}  # the AOF's
    assert client.config_get("auto-aof-rewrite-min-size") == {"auto-aof-rewrite-min-size": str(64 << 20)}  # bound
    pid = handle.pid
    handle.close()
    assert handle.pid is None and not ping(handle.url, timeout_s=0.3) and not ping(handle.tcp_url, timeout_s=0.3)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the process is gone, not just unreachable
    assert (tmp_path / "redis" / "appendonly.aof").exists()


def test_restart_after_sigkill_keeps_every_acknowledged_write(tmp_path):
    with start_embedded(tmp_path / "redis", appendonly=True) as handle:
        client = handle.client()
        ids = [client.xadd("s", {"i": i}) for i in range(200)]
        client.set("k", "v")
        handle.restart(kill=True)  # a crash: no clean shutdown, only what the AOF fsynced survives
        assert [entry_id for entry_id, _ in client.xrange("s")] == ids
        assert client.get("k") == b"v"


def test_a_data_dir_too_long_for_a_socket_address_puts_the_socket_elsewhere(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    with start_embedded(deep, appendonly=False) as handle:
        socket_path = handle.url.removeprefix("unix://")
        assert len(socket_path) < 100 and not socket_path.startswith(str(deep))
        handle.client().set("k", "v")
        handle.restart()
        assert handle.client().get("k") is None  # no AOF: a clean restart keeps nothing, but it is back up
    assert not os.path.exists(socket_path) and not os.path.exists(os.path.dirname(socket_path))


def test_embedded_without_data_dir_uses_a_temporary_one():
    with start_embedded(appendonly=False) as handle:
        data_dir = handle.data_dir
        assert handle.client().config_get("appendonly") == {"appendonly": "no"}
        assert data_dir.exists()
    assert not data_dir.exists()


def test_open_redis_prefers_config_url_then_env_then_embedded(monkeypatch, redis_url, tmp_path):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    with open_redis(RedisConfig(url=redis_url), tmp_path) as handle:
        assert handle.url == redis_url and not handle.embedded
    with pytest.raises(RedisUnavailable, match="127.0.0.1:1"):  # redis.url unset: the loader takes REDIS_URL
        open_redis(load_config(None).redis, tmp_path)
    monkeypatch.setenv("REDIS_URL", redis_url)
    with open_redis(load_config(None).redis, tmp_path) as handle:
        assert handle.url == redis_url and not handle.embedded
    monkeypatch.delenv("REDIS_URL")
    with open_redis(RedisConfig(appendonly=True), tmp_path / "run-redis") as handle:
        assert handle.embedded and handle.client().ping()
        assert (tmp_path / "run-redis" / "appendonly.aof").exists()


def test_unreachable_url_is_a_clear_error_with_the_password_masked():
    with pytest.raises(RedisUnavailable) as info:
        connect("redis://:hunter2@127.0.0.1:1/0", timeout_s=0.5)
    message = str(info.value)
    assert message.startswith("cannot reach Redis at redis://:***@127.0.0.1:1/0")
    assert "hunter2" not in message


def test_url_forms():
    with pytest.raises(ValueError, match="must start with redis://"):
        make_client("http://127.0.0.1:6379")
    tls = make_client("rediss://:pw@redis.example:6380/2")
    assert tls.connection_pool.connection_class.__name__ == "SSLConnection"
    assert tls.connection_pool.connection_kwargs["password"] == "pw"
    assert tls.connection_pool.connection_kwargs["db"] == 2
    unix = make_client("unix:///tmp/some.sock?db=1")
    assert unix.connection_pool.connection_kwargs["path"] == "/tmp/some.sock"
    assert "socket_keepalive" not in unix.connection_pool.connection_kwargs
    assert masked("rediss://user:pw@h:1/0") == "rediss://user:***@h:1/0"
    assert masked("redis://h:1/0") == "redis://h:1/0"


def test_restart_refuses_an_external_server(redis_url):
    with pytest.raises(RuntimeError, match="embedded"):
        connect(redis_url).restart()


def test_an_embedded_server_that_exits_on_a_full_disk_is_revived_with_its_data(tmp_path):
    import redis

    from tests.small_disk import remount, tmpfs

    with tmpfs(tmp_path / "disk", size="1m") as disk, start_embedded(disk / "redis", appendonly=True) as handle:
        client = handle.client()
        assert handle.exit_reason() is None and handle.revive() is None  # running: nothing to do
        acknowledged = 0
        with pytest.raises(redis.RedisError):  # Redis exits on the AOF write error (appendfsync always)
            for i in range(100):
                client.set(f"k{i}", b"x" * 65536)
                acknowledged = i + 1
        assert 0 < acknowledged < 16
        pid = handle._process.pid
        handle._process.wait(timeout=10)
        why = handle.exit_reason()
        assert why is not None and why.startswith("exit status 1"), why
        assert "AOF write error" in why, why  # the cause, from the server's log
        remount(disk, "8m")  # space freed
        assert handle.revive() == why
        assert handle.pid not in (None, pid) and handle.exit_reason() is None
        for i in range(acknowledged):  # every write Redis acknowledged is back
            assert client.get(f"k{i}") == b"x" * 65536
        client.set("after", b"1")
        assert client.get("after") == b"1"


def test_the_drivers_keeper_restarts_an_exited_server_at_most_limit_times(tmp_path, capsys):
    import signal

    from services.redis_keeper import EmbeddedRedisKeeper

    with start_embedded(tmp_path / "redis", appendonly=True) as handle:
        keep = EmbeddedRedisKeeper(handle, limit=1)
        keep()  # running: nothing to do
        assert keep.restarts == 0
        handle.client().set("k", b"v")
        os.kill(handle.pid, signal.SIGKILL)
        handle._process.wait(timeout=10)
        keep()
        assert keep.restarts == 1 and handle.client().get("k") == b"v"
        assert "the embedded Redis exited (killed by signal 9" in capsys.readouterr().err
        os.kill(handle.pid, signal.SIGKILL)
        handle._process.wait(timeout=10)
        with pytest.raises(RedisUnavailable, match=r"exited again \(killed by signal 9.*after 1 restarts"):
            keep()


def test_the_keepers_thread_restarts_a_killed_server_while_the_driver_is_busy_elsewhere(tmp_path):
    """`pcl chaos`, seed 2: the embedded Redis killed while a resumed driver started Ray stayed down 10 s, until the
    driver's loop first called its keeper. The keeper's own thread brings it back within a second, maxmemory and
    all (a revived server used to come back with none)."""
    import signal

    from services.redis_keeper import EmbeddedRedisKeeper

    with start_embedded(tmp_path / "redis", appendonly=True, maxmemory_mb=32) as handle:
        keep = EmbeddedRedisKeeper(handle, limit=3).watch(interval_s=0.1)
        try:
            handle.client().set("k", b"v")
            os.kill(handle.pid, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while keep.restarts == 0 or not ping(handle.url):  # nobody calls keep(): its thread does
                assert time.monotonic() < deadline, "the keeper's thread did not restart the server"
                time.sleep(0.05)
            client = handle.client()
            assert client.get("k") == b"v" and int(client.config_get("maxmemory")["maxmemory"]) == 32 * 2**20
        finally:
            handle.close()
            keep.stop()


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "no-setpriv"])
def test_a_server_the_keepers_thread_started_stops_when_the_thread_ends(tmp_path, monkeypatch, setpriv):
    """Without util-linux's setpriv (no parent-death signal) the keeper's thread stops what it started itself."""
    import signal

    import services.redis_server as redis_server
    from services.redis_keeper import EmbeddedRedisKeeper

    if not setpriv:
        monkeypatch.setattr(redis_server, "_die_with_starter", lambda: ())
    elif not redis_server._die_with_starter():
        pytest.skip("util-linux's setpriv with --pdeathsig is not installed")
    with start_embedded(tmp_path / "redis", appendonly=False) as handle:
        keep = EmbeddedRedisKeeper(handle, limit=3).watch(interval_s=0.1)
        try:
            os.kill(handle.pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while keep.restarts == 0 or not ping(handle.url):
                assert time.monotonic() < deadline, "the keeper's thread did not restart the server"
                time.sleep(0.05)
            revived = handle.process
        finally:
            keep.stop()
        assert revived.poll() is not None and not ping(handle.url, timeout_s=0.3)


def _ended(pid: int) -> bool:
    """The process is gone, or a zombie nobody has reaped yet (its parent was killed)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_redis_starts_without_python_in_the_forked_child_and_ends_with_the_thread_or_process_that_started_it(
        tmp_path):
    """A driver holds a gloo process group and many threads; a forked child that ran Python before exec (a
    `preexec_fn`) once crashed tearing that group down, leaving the run without Redis. Started from the main
    thread and from the keeper's, no Python code runs in the child; the server still ends when the thread that
    started it ends, and when the process is SIGKILLed (no atexit, no close())."""
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115
    worker = subprocess.Popen([sys.executable, "-m", "tests.services.redis_fork_worker", str(tmp_path)], cwd=REPO,
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    ready, pids = tmp_path / "ready.json", []
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, "the worker did not start: " + (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        seen = json.loads(ready.read_text())
        pids = [seen["revived"], seen["other"]]
        assert not (tmp_path / "forked-child-ran-python").exists(), "Python ran between fork and exec"
        assert seen["revived"] != seen["first"] and ping(seen["tcp_url"])
        assert seen["value"] == "v" and seen["maxmemory"] == 32 * 2**20
        assert seen["brief_ended"], "a server revived from a thread outlived it"
        worker.kill()
        worker.wait()
        deadline = time.monotonic() + 60
        while not all(_ended(pid) for pid in pids):
            assert time.monotonic() < deadline, "a server outlived the process that started it"
            time.sleep(0.05)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        log.close()
        for pid in pids:
            if not _ended(pid):
                os.kill(pid, signal.SIGKILL)
