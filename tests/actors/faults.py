"""Helpers of the fault tests: a tiny training run in a background thread of the test process (on the test's
local Ray), and SIGKILL of an actor's process found by its Ray process title (`ray::ClassName...`), as an
operator would do it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from pcl.checkpoint_store import COMPLETE
from pcl.loop.runlog import METRICS_FILE, SELECTIONS_FILE, read_metrics

M, N = 8, 4
# Small steps, quick reclaim of a dead consumer's entries, short deadlines: faults show within seconds.
FAST = [f"run.m={M}", f"run.n={N}", "run.eval_every=0", "data.tiny_size=256", "value.ev_sample=4", "selection.k=2",
        "control.port=0", "run.time_budget_s=null", "redis.visibility_timeout_s=2", "learner.timeout_s=120",
        "rollout.step_timeout_s=300", "rollout.max_new_tokens=8"]


class TrainingThread(threading.Thread):
    """`run_training(cfg, run_dir)` in a thread; `.result` is its exit code or the exception it raised."""

    def __init__(self, cfg, run_dir: Path, resume: str | None = None):
        super().__init__(daemon=True, name="pcl-training")
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        self.result: object = None

    def run(self) -> None:
        from entrypoints.train import run_training

        try:
            self.result = run_training(self.cfg, run_dir=str(self.run_dir), resume=self.resume)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.result = exc


def _parent(pid: int | str) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def actor_pids(class_name: str) -> list[int]:
    """PIDs of live processes whose title is `ray::<class_name>` (idle) or `ray::<class_name>.<method>`, of
    this test process's own Ray (their raylet is its child): never another Ray's on a shared machine."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        raylet = _parent(entry.name)
        if (title == f"ray::{class_name}" or title.startswith(f"ray::{class_name}.")) and raylet is not None \
                and _parent(raylet) == os.getpid():
            pids.append(int(entry.name))
    return sorted(pids)


def embedded_redis_pid(data_dir: Path) -> int:
    """PID of the redis-server working in `data_dir` (the run's embedded Redis: it changes its process title,
    but it works in its `dir`)."""
    for entry in Path("/proc").iterdir():
        try:
            title = (entry / "cmdline").read_bytes().split(b" ")[0] if entry.name.isdigit() else b""
            if title.endswith(b"redis-server") and os.readlink(entry / "cwd") == str(data_dir.resolve()):
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no redis-server running in {data_dir}")


def sigkill(class_name: str, index: int = 0) -> int:
    pids = actor_pids(class_name)
    assert pids and -len(pids) <= index < len(pids), f"no live {class_name} process #{index} (found {pids})"
    os.kill(pids[index], signal.SIGKILL)
    return pids[index]


def wait_until(predicate, timeout_s: float, what: str, thread: TrainingThread | None = None,
               interval_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if thread is not None and not thread.is_alive():
            raise AssertionError(f"the run ended ({thread.result!r}) before {what}")
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(interval_s)


def steps_logged(run_dir: Path) -> list[int]:
    path = run_dir / METRICS_FILE
    return [r["step"] for r in read_metrics(path) if "effective_ratio" in r] if path.exists() else []


def checkpoint_written(run_dir: Path, step: int) -> bool:
    return (run_dir / "checkpoints" / f"step-{step:06d}" / COMPLETE).is_file()


def assert_each_step_once_and_exact_batches(run_dir: Path, steps: int) -> list[dict]:
    """Every step 1..steps logged exactly once, in order, and each committed batch holding each (prompt, sample)
    exactly once; the same steps in selections.jsonl. Returns the step records."""
    records = [r for r in read_metrics(run_dir / METRICS_FILE) if "effective_ratio" in r]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:
        assert r["batch_samples"] == r["batch_unique_samples"] == M * N, r
        assert r["dropped_stale_version"] == 0, r
    selections = read_metrics(run_dir / SELECTIONS_FILE)
    assert [s["step"] for s in selections] == list(range(1, steps + 1))
    assert all(len(s["ids"]) == len(set(s["ids"])) == M for s in selections)
    return records
