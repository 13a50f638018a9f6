"""What interrupted a run, in the run's own records: RUN_DIR/events.jsonl, written by the driver, one JSON line per
change, with Unix times, so that a reader (a chaos run's checks: a control-plane 503 is excused only inside one of
these windows) needs nothing but the run directory.

    events = RunEvents(run_dir)
    events.record("redis_restart", start, end, "killed by signal 9")     # a window known whole
    key = events.begin("restart", "LearnerLost: ...")                     # one whose end is not known yet
    events.end(key)
    read_events(run_dir)    # [{"type", "start", "end" (None: never closed), "detail", "pid"}], by start

The types:

- `driver_start`: a `pcl train` process, from its start to its actors up (a fresh run, or a --resume);
- `restart`: a restart from a checkpoint inside one driver, from the failure caught to its actors up again;
- `redis_restart`: the embedded Redis found exited and started again (services/redis_keeper.py), from the last
  moment the driver saw it running to its start;
- `redis_unreachable`, `redis_full`: the driver's probe of its Redis (a PING and a small write every second)
  failing, for the server unreachable (or loading its data) or refusing writes (maxmemory), from the last probe
  that went through to the first that went through again.

A window is written when it opens (`begin`) and again when it closes (`end`): a driver killed in between leaves it
open (end None), and a reader closes it at the next driver's start. Lines are appended and flushed one at a time;
a last line cut short by a kill is skipped.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

EVENTS_FILE = "events.jsonl"
TYPES = ("driver_start", "restart", "redis_restart", "redis_unreachable", "redis_full")


class RunEvents:
    """The driver's writer of RUN_DIR/events.jsonl (thread-safe: the Redis keeper writes from its own thread)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / EVENTS_FILE
        self.pid = os.getpid()
        self._lock = threading.Lock()

    def _write(self, line: dict) -> None:
        with self._lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
            out.flush()

    def begin(self, kind: str, detail: str = "", start: float | None = None) -> str:
        """Open a window of `kind` from `start` (now by default); returns its key for `end`."""
        if kind not in TYPES:
            raise ValueError(f"unknown run event type {kind!r}; types are {list(TYPES)}")
        key = uuid.uuid4().hex[:16]  # unique across drivers (a pid may come back)
        self._write({"id": key, "type": kind, "start": time.time() if start is None else start,
                     "detail": detail[:500], "pid": self.pid})
        return key

    def end(self, key: str, end: float | None = None) -> None:
        self._write({"id": key, "end": time.time() if end is None else end})

    def record(self, kind: str, start: float, end: float, detail: str = "") -> None:
        """A window known whole."""
        self.end(self.begin(kind, detail, start), end)


def read_events(run_dir: str | os.PathLike) -> list[dict] | None:
    """The run's windows, by start: {"type", "start", "end", "detail", "pid"}; a window its driver never closed
    ends at the next driver's start (None when there is none). None when the run wrote no events file."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.is_file():
        return None
    opened: dict[str, dict] = {}
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if "type" in line:
            opened[line["id"]] = {key: line.get(key) for key in ("type", "start", "detail", "pid")} | {"end": None}
        elif line.get("id") in opened:
            opened[line["id"]]["end"] = line.get("end")
    windows = sorted(opened.values(), key=lambda w: w["start"])
    starts = [w["start"] for w in windows if w["type"] == "driver_start"]
    for window in windows:
        if window["end"] is None:
            window["end"] = next((s for s in starts if s > window["start"]), None)
    return windows
