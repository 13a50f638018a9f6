"""Starting the control plane: in a thread of `pcl train`, or as its own process (`pcl control`).

    plane = DriverControl(cfg, redis_url, run_dir, k_max=len(train) // m, fresh=True)   # pcl train
    ...
    plane.close()

    serve_forever(cfg.control, redis_url, run="tiny")                                   # pcl control

The API token comes from `control.token`, else `PCL_API_TOKEN`; with neither, one is generated and printed
once, and the server binds 127.0.0.1 whatever `control.host` says (an unguessable token nobody configured
is only safe on the local machine). The token is never written to status, logs, metrics or files.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pcl.config import Config, ConfigError, ControlConfig
from pcl.credentials import check_token
from pcl.loop.record import check_keys
from services.control.requests import ControlRequests
from services.control.store import ControlStore

if TYPE_CHECKING:
    from fastapi import FastAPI

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# The control plane's connections to Redis, opened as it starts and shared by the threads that serve requests (up to
# 40 at once) and the driver's own reads: a fixed number all run long, whatever the load (a request waits for one
# while all are in use; each holds one for a millisecond or so).
CONTROL_REDIS_CONNECTIONS = 8
# How long one of its Redis commands waits for an answer (redis-py's socket timeout; each command is tried up to
# 3 times): a Redis that accepts connections and answers nothing (its process frozen, its node cut off, a proxy in
# front of a Redis that is down) is met with the last good reading within seconds (services/control/outage.py).
# Its commands are small (a history page: about 1 MiB) and none blocks.
CONTROL_REDIS_TIMEOUT_S = 2.0


def resolve_token(configured: str | None) -> tuple[str, bool]:
    """(token, generated): control.token (which the config loader fills from PCL_API_TOKEN), else a new random
    token. A short or placeholder token is a ConfigError naming the setting (never the token)."""
    token = configured
    if not token:
        return secrets.token_urlsafe(32), True
    try:
        return check_token(token, "control.token"), False
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def serve(control: ControlConfig, store: ControlRequests, stream=None) -> "ControlServer":
    """Start the control plane of `store`'s run in a background thread and say where it is."""
    from services.control.api import create_app

    stream = stream or sys.stdout
    token, generated = resolve_token(control.token)
    host = control.host
    if generated and host not in LOCAL_HOSTS:
        print(
            f"pcl: no API token configured (control.token, PCL_API_TOKEN): binding 127.0.0.1, not {host}",
            file=stream,
            flush=True,
        )
        host = "127.0.0.1"
    try:
        server = ControlServer(create_app(store, token, control), host, control.port).start()
    except RuntimeError:
        raise ConfigError(
            f"control.port = {control.port}: cannot listen on {host}:{control.port} (in use?); "
            f"control.port=0 picks a free port, control.enabled=false serves no control plane"
        ) from None
    docs = f"API docs {server.url}/docs" if control.docs else f"API schema {server.url}/openapi.json"
    print(
        f"pcl: control plane at {server.url}  (dashboard {server.url}/, {docs})",
        file=stream,
        flush=True,
    )
    if generated:
        print(
            f"pcl: API token (generated; set control.token or PCL_API_TOKEN to choose one): {token}",
            file=stream,
            flush=True,
        )
    return server


def control_client(redis_url: str):
    """The control plane's Redis client (`pcl-control` in CLIENT LIST): CONTROL_REDIS_CONNECTIONS connections, a
    request that finds them all in use waiting up to REDIS_WAIT_S for one (then answered as Redis unreachable)."""
    from services.control.outage import REDIS_WAIT_S
    from services.redis_server import bounded_client

    return bounded_client(redis_url, "control", CONTROL_REDIS_CONNECTIONS, REDIS_WAIT_S, decode_responses=True,
                          socket_timeout=CONTROL_REDIS_TIMEOUT_S)


class ControlServer:
    """uvicorn serving an app from a daemon thread of this process (port 0 picks a free port)."""

    def __init__(self, app: "FastAPI", host: str, port: int):
        import uvicorn  # imported by the process that serves (pcl train without a control plane needs none)

        self.host = host
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, name="pcl-control-plane", daemon=True)

    def start(self, timeout_s: float = 15.0) -> "ControlServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the control plane did not start on {self.host}:{self.server.config.port}"
                )
            time.sleep(0.02)
        return self

    def _serve(self) -> None:
        try:
            self.server.run()
        except SystemExit:  # uvicorn exits when it cannot bind; start() reports that
            pass

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class DriverControl:
    """The driver's share of the control state: resets it for a fresh run, serves the control plane when
    control.enabled, writes RUN_DIR/control.json (where it listens; no secret), and marks a failed run."""

    def __init__(
        self, cfg: Config, redis_url: str, run_dir: Path, k_max: int, fresh: bool, tools_url: str = "",
        snapshot: dict | None = None, overrides: dict | None = None,
    ):
        """`overrides`: the tunable selection settings a resumed run's config overrides (pcl.loop.resume): they
        replace what the control plane asked for before, loudly."""
        from services.redis_keeper import wait_while_full
        from services.redis_server import masked

        self.store = ControlStore(control_client(redis_url), cfg.run.name, depth_cache_s=cfg.control.depth_cache_s)
        wait_while_full(lambda: self._prepare(k_max, fresh, snapshot, overrides or {}), "the control state",
                        cfg.redis.full_timeout_s)
        self.server = serve(cfg.control, self.store) if cfg.control.enabled else None
        info = {
            "run": cfg.run.name,
            "url": self.server.url if self.server else None,
            "redis_url": masked(tools_url or redis_url),
        }
        (Path(run_dir) / "control.json").write_text(json.dumps(info, indent=2) + "\n")

    def _prepare(self, k_max: int, fresh: bool, snapshot: dict | None, overrides: dict) -> None:
        """The run's control state: reset for a fresh run; a resumed one's kept (a checkpoint's snapshot fills in
        for a Redis without it), reopened, with the config's overrides. Safe to repeat."""
        if fresh:
            self.store.reset()
        else:
            if snapshot:
                self.store.restore(snapshot)
            self.store.reopen()
            for key, old in self.store.override_params(overrides, "driver").items():
                print(f"pcl: control: selection.{key}={overrides[key]!r} given with --resume replaces {key}={old} "
                      f"asked for through the control plane", flush=True)
        self.store.set_k_max(k_max)

    def failed(self, exc: BaseException) -> None:
        """The run stopped on an error (or an interrupt): say so in the status the control plane serves."""
        status = self.store.published()
        if status.get("state") in ("finished", "failed"):
            return
        status.update(
            run=self.store.run,
            state="failed",
            paused=False,
            updated_at=time.time(),
            error=f"{type(exc).__name__}: {str(exc)[:300]}",
        )
        try:
            self.store.write_status(status)
            self.store.add_event("failed", "driver", error=status["error"])
            self.store.clear_heartbeat()
        except Exception:  # noqa: BLE001 - Redis may be what failed; the run's own error matters more
            pass

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.store.client.close()


def serve_forever(control: ControlConfig, redis_url: str, run: str) -> int:
    """`pcl control`: serve a run's control plane from this process until interrupted."""
    from services.redis_server import RedisUnavailable, connect

    try:
        connect(redis_url).close()
    except (RedisUnavailable, ValueError) as exc:  # unreachable, or not a redis:// / rediss:// / unix:// URL
        raise ConfigError(str(exc)) from None
    store = ControlRequests(control_client(redis_url), run, depth_cache_s=control.depth_cache_s)
    server = serve(control, store)
    print(f"pcl: serving run {run!r}; Ctrl-C stops", flush=True)
    try:
        while server.thread.is_alive():
            server.thread.join(timeout=1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


# -- pcl status ----------------------------------------------------------------------------------------------

STATUS_METRICS = (
    "effective_ratio",
    "train_reward_mean",
    "selected_value_mean",
    "value_explained_variance",
    "selection_seconds",
    "generation_seconds",
    "train_seconds",
    "weight_sync_seconds",
    "step_seconds",
)
check_keys(STATUS_METRICS, "services.control.server.STATUS_METRICS")  # the step figures `pcl status` prints


def fetch_status(url: str, timeout_s: float = 5.0) -> dict:
    """GET {url}/v1/status; raises OSError naming the URL when the control plane does not answer."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/v1/status", timeout=timeout_s) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise OSError(f"no control plane answers at {url}: {getattr(exc, 'reason', exc)}") from None


def format_status(status: dict) -> str:
    """The status as a two-column terminal table."""

    def num(value, fmt: str = ".3f") -> str:
        return "-" if value is None else format(value, fmt) if isinstance(value, float) else str(value)

    steps = f"{status.get('step')}" + (f" / {status['steps_total']}" if status.get("steps_total") else "")
    pending = ", ".join(f"{k}={v}" for k, v in (status.get("pending_params") or {}).items())
    beat = (status.get("coordinator") or {}).get("heartbeat_age_s")
    rows = [
        ("run", status.get("run")),
        ("state", status.get("state")),
        ("step", steps),
        ("policy version", num(status.get("policy_version"))),
        ("strategy", status.get("strategy") or "-"),
        ("tau", num(status.get("tau"))),
        ("k", num(status.get("k"))),
        ("pending", pending or "-"),
        ("coordinator", "-" if beat is None else f"heartbeat {beat:.1f}s ago"),
    ]
    if status.get("eval"):
        rows.append(
            ("eval accuracy", f"{num(status['eval'].get('accuracy'))} (step {status['eval'].get('step')})")
        )
    if status.get("error"):
        rows.append(("error", status["error"]))
    last = status.get("last_step") or {}
    rows += [(key, num(last.get(key))) for key in STATUS_METRICS if key in last]
    rows += [(f"queue {name}", str(depth)) for name, depth in (status.get("queue_depths") or {}).items()]
    rows += [(f"actor {name}", health) for name, health in (status.get("actors") or {}).items()]
    checkpoint = (status.get("checkpoint") or {}).get("pending")
    if checkpoint:
        rows.append(("checkpoint", f"requested ({checkpoint.get('id')})"))
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)
