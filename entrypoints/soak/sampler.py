"""What a soak samples, from outside the run, every few seconds: each process of the run (RSS, threads, open file
descriptors), the run's Redis (used memory, every stream's length, the control history's records and bytes),
every file and folder the run writes (its run directory by file, its Ray session directory), and the control
plane's largest answers (a full page of /v1/history, /metrics: bytes and seconds).

    sampler = Sampler(tree, run_dir, run_name, driver_pid=lambda: driver.pid)
    sample = sampler.sample(t=12.0, step=40, control_url=url)   # one JSON-ready dict, see `Sampler.sample`

The run's processes are this process's descendants (`entrypoints.chaos.procs.ProcessTree`, a subreaper): the
driver, the local Ray it starts (GCS server, raylet, log monitor, Ray's agents and workers), each actor and the
processes an actor starts (verifier pools, vLLM's engine), the embedded Redis. Nothing else on the machine is
looked at: other Ray clusters on it are other processes' descendants. Each process gets a stable label from its
role, `driver`, `gcs_server`, `raylet`, `redis-server`, `RolloutWorker` (Ray's `ray::Class` title), a second of
a role `LearnerRank#2`, a child of an actor `RewardVerifier/child`, so that a series follows one process; one
started again gets a new label (`#3`...), and the report counts it.

The Ray session directory is the one named on this run's own GCS server's command line (`--log_dir=.../logs`).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Callable

import psutil

from entrypoints.chaos.procs import ProcessTree, ray_class, title_of

HISTORY_PAGE_PATH = "/v1/history?limit=1000"  # the largest page the API answers (services/control/api.py)
METRICS_PATH = "/metrics"
SCRIPT = re.compile(r"/([\w.-]+?)(?:\.py)?(?:\s|$)")  # a Python process's script, e.g. .../log_monitor.py


PROVISIONAL = ("ray-idle", "default_worker", "setup_worker")  # a Ray worker before an actor takes it


def role_of(title: str) -> str:
    """A process's role from its title: its Ray class, `ray-idle` (a pooled Ray worker with no actor yet), the
    binary's name (gcs_server, raylet, redis-server), a Python script's path within Ray's package without `.py`
    and `_private/` (log_monitor, dashboard/agent, runtime_env/agent/main, workers/default_worker...), else the
    script's name."""
    cls = ray_class(title)
    if cls == "IDLE":
        return "ray-idle"
    if cls:
        return cls
    argv = title.split(" ")
    binary = os.path.basename(argv[0]) if argv else ""
    if binary.startswith("python") and len(argv) > 1:
        script = next((arg for arg in argv[1:] if not arg.startswith("-")), "")
        inside = script.rsplit("/ray/", 1)[1] if "/ray/" in script else os.path.basename(script)
        role = inside.removesuffix(".py").replace("_private/", "")
        return role.removeprefix("workers/") or binary
    return binary or "?"


class ProcessLabels:
    """Stable labels for the run's processes: one per (pid, start time), fixed once its role is known (a pooled
    Ray worker is provisional, `ray-idle` or `default_worker`, until an actor takes it)."""

    def __init__(self) -> None:
        self.labels: dict[tuple[int, float], str] = {}
        self.count: dict[str, int] = {}

    def label(self, key: tuple[int, float], role: str) -> str:
        known = self.labels.get(key)
        if known is not None and (known.split("#")[0] not in PROVISIONAL or role in PROVISIONAL):
            return known
        self.count[role] = self.count.get(role, 0) + 1
        label = role if self.count[role] == 1 else f"{role}#{self.count[role]}"
        self.labels[key] = label
        return label


def process_figures(proc: psutil.Process) -> tuple[int, int, int] | None:
    """(RSS bytes, threads, open file descriptors) of a process, None when it is gone or hidden."""
    try:
        with proc.oneshot():
            return proc.memory_info().rss, proc.num_threads(), proc.num_fds()
    except psutil.Error:
        return None


def tree_size(path: Path) -> int:
    """Bytes of the regular files under `path` (a file: its size; 0 when missing)."""
    try:
        if path.is_file():
            return path.stat().st_size
    except OSError:
        return 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def run_dir_files(run_dir: Path) -> dict[str, int]:
    """The run directory by file (paths relative to it); checkpoints/ counted as one folder (with the number of
    complete checkpoints as `checkpoints/#`), a tracker's folder of event files as one."""
    out: dict[str, int] = {}
    if not run_dir.is_dir():
        return out
    for entry in sorted(run_dir.iterdir()):
        if entry.is_file():
            out[entry.name] = tree_size(entry)
        elif entry.name == "checkpoints":
            out["checkpoints/"] = tree_size(entry)
            out["checkpoints/#"] = sum(1 for c in entry.glob("step-*") if c.is_dir())
        elif entry.name == "redis":
            for item in sorted(entry.iterdir()):
                if item.is_file() and not item.is_socket():
                    out[f"redis/{item.name}"] = tree_size(item)
        elif entry.is_dir():
            out[f"{entry.name}/"] = tree_size(entry)
    return out


def ray_session_dir(gcs_title: str) -> Path | None:
    """The Ray session directory on a GCS server's command line (its --log_dir is SESSION/logs)."""
    match = re.search(r"--log_dir=(\S+)", gcs_title)
    return Path(match.group(1)).parent if match else None


def session_files(session: Path) -> dict[str, int]:
    """A Ray session directory: its total, its logs/ folder's total, and each log file (bytes) by its path under
    logs/, those of its folders included (old/: Ray's log monitor moves a dead worker's .out and .err there)."""
    out = {"session/": tree_size(session), "logs/": tree_size(session / "logs")}
    logs = session / "logs"
    for root, _, files in os.walk(logs):
        for name in files:
            path = Path(root, name)
            try:
                out[f"logs/{path.relative_to(logs).as_posix()}"] = path.lstat().st_size
            except OSError:
                continue
    return out


def timed_get(url: str, token: str | None = None, timeout_s: float = 30.0) -> tuple[int, float] | None:
    """(bytes, seconds) of one GET, None when it got no 200."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as answer:
            size = len(answer.read())
            return (size, round(time.perf_counter() - started, 4)) if answer.status == 200 else None
    except OSError:
        return None


class Sampler:
    def __init__(self, tree: ProcessTree, run_dir: Path, run_name: str, driver_pid: Callable[[], int | None],
                 metrics_file: str = "metrics.jsonl", extra_files: dict[str, Path] | None = None):
        """`metrics_file`: the run's step records in RUN_DIR (pcl.loop.runlog.METRICS_FILE); `extra_files`: files
        the run writes outside its run directory (the driver's output), by label."""
        self.tree, self.run_dir, self.run_name, self.driver_pid = tree, run_dir, run_name, driver_pid
        self.metrics_path = run_dir / metrics_file
        self.extra_files = extra_files or {}
        self.labels = ProcessLabels()
        self.session: Path | None = None
        self._redis = None
        self._metrics_offset, self._step = 0, 0

    def steps(self) -> int:
        """The last training step in RUN_DIR/metrics.jsonl, read on from where the last call stopped."""
        path = self.metrics_path
        try:
            if path.stat().st_size < self._metrics_offset:  # rewritten shorter: a restart from a checkpoint
                self._metrics_offset = 0
            with open(path, "rb") as f:
                f.seek(self._metrics_offset)
                for line in f:
                    if not line.endswith(b"\n"):
                        break
                    self._metrics_offset += len(line)
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if "effective_ratio" in record:
                        self._step = int(record["step"])
        except OSError:
            pass
        return self._step

    def sample(self, t: float, step: int, control_url: str | None) -> dict:
        """One sample: {"t", "step", "procs": {label: [rss, threads, fds]}, "redis": {...}, "files": {...},
        "ray": {...}, "control": {path: [bytes, seconds]}}."""
        return {"t": round(t, 2), "step": step, "procs": self.processes(), "redis": self.redis(),
                "files": {**run_dir_files(self.run_dir),
                          **{name: tree_size(path) for name, path in self.extra_files.items()}},
                "ray": session_files(self.session) if self.session else {},
                "control": self.control(control_url)}

    def processes(self) -> dict[str, list[int]]:
        live = self.tree.scan()
        driver = self.driver_pid()
        out: dict[str, list[int]] = {}
        for pid, title in sorted(live.items()):
            try:
                proc = psutil.Process(pid)
                key = (pid, proc.create_time())
                parent = proc.ppid()
            except psutil.Error:
                continue
            role = "driver" if pid == driver else role_of(title)
            if role == "gcs_server" and self.session is None:
                self.session = ray_session_dir(title)
            parent_role = ray_class(title_of(parent)) if parent in live else None
            if parent_role and parent_role != "IDLE" and not ray_class(title):
                role = f"{parent_role}/child"  # a process an actor started: a verifier pool, an engine
            figures = process_figures(proc)
            if figures is not None:
                out[self.labels.label(key, role)] = list(figures)
        return out

    def redis(self) -> dict:
        """used_memory, maxmemory, each stream's length, the control history's records and bytes, and the
        connections of each named client; {} while the run's Redis does not answer."""
        client = self._client()
        if client is None:
            return {}
        try:
            info = client.info("memory")
            out = {"used_memory": info["used_memory"], "maxmemory": info.get("maxmemory", 0), "streams": {}}
            for key in client.scan_iter(match=f"pcl:{self.run_name}:*", count=1000, _type="stream"):
                out["streams"][key.decode().removeprefix(f"pcl:{self.run_name}:")] = client.xlen(key)
            history = f"pcl:{self.run_name}:history"
            out["history_records"] = client.zcard(history)
            out["history_bytes"] = client.memory_usage(history, samples=0) or 0
            # connections by client name (services.redis_server.make_client names them pcl-<name>): which one grew
            out["clients"] = dict(Counter(c.get("name") or "unnamed" for c in client.client_list()))
            return out
        except Exception:  # noqa: BLE001 - restarting, or gone at the end: this sample has no Redis figures
            self._redis = None
            return {}

    def _client(self):
        if self._redis is None:
            from services.redis_server import make_client

            try:
                url = json.loads((self.run_dir / "control.json").read_text())["redis_url"]
                self._redis = make_client(url, "soak", socket_timeout=10)
            except (OSError, ValueError, KeyError):
                return None
        return self._redis

    def control(self, url: str | None) -> dict[str, list[float]]:
        if not url:
            return {}
        out = {}
        for path in (HISTORY_PAGE_PATH, METRICS_PATH):
            got = timed_get(url + path)
            if got is not None:
                out[path] = list(got)
        return out
