"""Progress of a long wait (a build, a reference pass, an evaluation, a probe, an experiment): a tqdm bar on a
terminal, plain lines elsewhere (logs, CI), where a bar's carriage returns would be noise.

    with Progress(total=4096, desc="reference pass rates", unit="prompt") as bar:
        for chunk in chunks:
            ...
            bar.update(len(chunk))

A process that cannot show it itself (the coordinator actor) reports through a small file the driver reads:
`write_progress(run_dir, task, done, total, started)` / `read_progress(run_dir)`, shown by `TaskProgress`
(`reporter(run_dir, task)` makes a generation call's `on_progress` that writes it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

PROGRESS_FILE = "progress.json"  # the coordinator's current long task, in the run directory


class Progress:
    """`update(n)` / `set(done)` until `close()`. On a terminal, a tqdm bar on stderr; otherwise a line on
    `stream` (default stdout) at every tenth of the total, and at the end, with the elapsed time."""

    def __init__(self, total: int, desc: str, unit: str = "it", stream: IO[str] | None = None,
                 terminal: bool | None = None, lines: bool = True, started: float | None = None):
        self.total, self.desc, self.unit, self.done = max(int(total), 0), desc, unit, 0
        self.stream = stream or sys.stdout
        self.started = time.monotonic() if started is None else started  # time.monotonic() of the task's start
        self.lines = lines  # plain lines where there is no terminal (off where the caller prints its own)
        self.next_tenth = 1  # plain lines: the next tenth of the total to print a line at
        self.bar = None
        if sys.stderr.isatty() if terminal is None else terminal:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False)

    def set(self, done: int) -> None:
        self.update(done - self.done)

    def update(self, n: int = 1) -> None:
        if n <= 0:
            return
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        if self.bar is not None:
            self.bar.update(n)
        elif self.lines and self.total and 10 * self.done >= self.next_tenth * self.total:
            self.next_tenth = 10 * self.done // self.total + 1
            self._line()

    def _line(self) -> None:
        pct = 100 * self.done / self.total if self.total else 100.0
        print(f"pcl: {self.desc}: {self.done}/{self.total} {self.unit}s ({pct:.0f}%), "
              f"{time.monotonic() - self.started:.0f}s", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.lines and self.done and self.next_tenth <= 10:  # where it stopped, when not at the end
            self.next_tenth = 11
            self._line()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def write_progress(run_dir: str | os.PathLike, task: str, done: int, total: int, started: float,
                   unit: str = "sample") -> None:
    """Record the current long task of a process the user cannot see (atomically): `started` (its start's
    time.time()) tells two runs of a task apart."""
    path = Path(run_dir) / PROGRESS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"task": task, "done": done, "total": total, "started": started, "unit": unit}))
    os.replace(tmp, path)


def reporter(run_dir: str | os.PathLike, task: str, offset: int = 0, total: int | None = None,
             started: float | None = None):
    """A generation call's `on_progress(done, expected)`: the task's samples so far (after `offset` of `total`)
    recorded with `write_progress`, at most twice a second and at the end."""
    last, started = [0.0], started or time.time()

    def report(done: int, expected: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5 or done == expected:
            last[0] = now
            write_progress(run_dir, task, offset + done, total or expected, started)

    return report


def read_progress(run_dir: str | os.PathLike) -> dict | None:
    """The task `write_progress` last recorded, or None."""
    try:
        state = json.loads((Path(run_dir) / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("task") else None


class TaskProgress:
    """The coordinator's long tasks (reference pass, evaluation: RUN_DIR/progress.json) as a bar or plain lines,
    for those still running after SHOW_AFTER_S: a short evaluation every few steps stays quiet."""

    SHOW_AFTER_S = 5.0

    def __init__(self, run_dir: Path, stream: IO[str] | None = None):
        (run_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier attempt's
        self.run_dir, self.stream = run_dir, stream
        self.key, self.first_seen, self.shown = None, 0.0, None

    def poll(self) -> None:
        state = read_progress(self.run_dir)
        key = (state["task"], state["total"], state.get("started")) if state else None
        if key != self.key:
            self.close()
            self.key, self.first_seen = key, time.monotonic()
        if state is None:
            return
        if self.shown is None and time.monotonic() - self.first_seen >= self.SHOW_AFTER_S \
                and state["done"] < state["total"]:
            begun = time.monotonic() - max(0.0, time.time() - float(state.get("started") or time.time()))
            self.shown = Progress(state["total"], state["task"], state.get("unit", "sample"), stream=self.stream,
                                  started=begun)
        if self.shown is not None:
            self.shown.set(state["done"])
            if state["done"] >= state["total"]:
                self.close()

    def close(self) -> None:
        if self.shown is not None:
            self.shown.close()
            self.shown = None

