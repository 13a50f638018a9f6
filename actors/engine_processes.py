"""No engine process outlives its rollout worker.

On GPU, vLLM runs its engine core (and, with tensor parallelism, its GPU workers) in child processes of the
rollout worker's actor process. When the engine dies, the worker ends its process and every child with it
(`end_process`), so Ray restarts it. When Ray kills the actor outright (SIGKILL), the children stay behind and
hold ~60% of a GPU's memory, so the restarted worker fails vLLM's free-memory check on the same GPU: each worker
records its children's process ids and start times in a file of its node (`record_engine_processes`), and its
next incarnation ends those that still run before it builds its engine (`reap_engine_processes`).

    reap_engine_processes(run, "rollout-0")       # first thing in the actor's __init__
    engine = make_engine(...)
    record_engine_processes(run, "rollout-0")     # once the engine's processes exist
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path

import psutil

log = logging.getLogger(__name__)
EXIT_CODE = 70  # the process ends with this status after its engine died (EX_SOFTWARE): Ray restarts it


def _pid_file(run: str, worker: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run}-{worker}")
    return Path(tempfile.gettempdir()) / "pcl-engines" / f"{safe}.json"


def record_engine_processes(run: str, worker: str) -> list[int]:
    """Write this process's descendants (the engine's processes) to the worker's file; returns their ids."""
    children = psutil.Process().children(recursive=True)
    path = _pid_file(run, worker)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([[c.pid, c.create_time()] for c in children if c.is_running()]))
    return [c.pid for c in children]


def reap_engine_processes(run: str, worker: str, timeout_s: float = 10.0) -> list[int]:
    """End the processes the worker's previous incarnation recorded that still run (the same process id and start
    time: not a recycled id); returns their ids."""
    path = _pid_file(run, worker)
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    alive = []
    for pid, created in recorded:
        try:
            process = psutil.Process(pid)
            if abs(process.create_time() - created) < 1e-3 and pid != os.getpid():
                alive.append(process)
        except psutil.Error:
            continue
    if alive:
        log.warning("%s: ending %d engine processes left by its previous process: %s", worker, len(alive),
                    [p.pid for p in alive])
        _terminate(alive, timeout_s)
    path.unlink(missing_ok=True)
    return [p.pid for p in alive]


def _terminate(processes: list[psutil.Process], timeout_s: float) -> None:
    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(processes, timeout=timeout_s)
    for process in still:
        try:
            process.kill()
        except psutil.Error:
            pass


def end_process(reason: BaseException | str, timeout_s: float = 10.0) -> None:
    """End this process and every process it started (the engine's), with EXIT_CODE: an unexpected exit to Ray,
    which restarts the actor (max_restarts). Never returns."""
    log.error("ending the worker's process (and its engine's processes) so that it is restarted: %r", reason)
    try:
        _terminate(psutil.Process().children(recursive=True), timeout_s)
    finally:
        logging.shutdown()
        os._exit(EXIT_CODE)
