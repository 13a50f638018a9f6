"""What a chaos run reads once its run has ended, for the invariants (`pcl.tools.chaos_checks`, pure): the run's
records (metrics.jsonl, selections.jsonl, events.jsonl), what its experiment tracker holds, its Redis as the run
left it, and the control-plane requests the chaos traffic recorded. Reading is kept apart from checking, so that
another way of running (a deployment with its own Redis) reads its run the same way and checks it alike.

    with run_redis(cfg, run_dir) as client:                  # the Redis the run used (below)
        streams, dead = read_streams(client, "chaos")
        incarnations = read_incarnations(client, "chaos")     # services/incarnations.py: the actors' heartbeats
    streams, dead = read_redis(run_dir / "redis", "chaos")   # the embedded server started again on its data
    metrics, selections = read_records(run_dir)
    reading = read_run(cfg, run_dir)                           # all of the above that the invariants read
    windows = read_run_events(run_dir)                         # outages and restarts (None: no record)
    requests = read_requests(out / "requests.jsonl")
    scalars = read_tracker_steps(run_dir)                     # TensorBoard: figure -> the steps written, in order

The embedded Redis stops with its run; with AOF on (a chaos run requires it: the embedded server saves no
snapshot) its data directory holds everything it acknowledged, so a server started again on that directory shows
the streams, their consumer groups, the entry counts the run kept and the dead letters exactly as the run left
them. A deployment's Redis (`redis.url`, or REDIS_URL) outlives its run: `run_redis` reads it where it is, starting
nothing. `read_streams(client, run)` reads the same from either.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from pcl.loop.runlog import METRICS_FILE, SELECTIONS_FILE, read_metrics


def read_records(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """Every complete line of metrics.jsonl and selections.jsonl (none when a file is missing)."""
    def lines(name: str) -> list[dict]:
        path = run_dir / name
        return read_metrics(path) if path.is_file() else []

    return lines(METRICS_FILE), lines(SELECTIONS_FILE)


def read_requests(path: Path) -> list[dict]:
    """The control-plane requests the chaos traffic recorded in `path` (OUT/requests.jsonl), each with what it
    expected (entrypoints/chaos/traffic.py); none when the file is missing; a last line cut short is skipped."""
    return read_jsonl(path)


def read_run_events(run_dir: Path) -> list[dict] | None:
    """The windows the run recorded in RUN_DIR/events.jsonl (services/run_events.py): its drivers' starts and
    restarts, its Redis restarted, unreachable or full; None when the run wrote none."""
    from services.run_events import read_events

    return read_events(run_dir)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return out


def read_tracker_steps(run_dir: Path) -> dict[str, list[int]] | None:
    """Each scalar figure in the run's TensorBoard event files (RUN_DIR/tensorboard, every file: a resumed driver
    adds one) -> the steps it was written at, in the order written, read raw (TensorBoard's own accumulator drops
    the events a step going back supersedes, which would hide a step written twice); None with no event file."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    files = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    if not files:
        return None
    steps: dict[str, list[int]] = {}
    for path in files:
        for event in LegacyEventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.WhichOneof("value") == "simple_value":
                    steps.setdefault(value.tag, []).append(int(event.step))
    return steps


@contextmanager
def run_redis(cfg, run_dir: Path) -> Iterator:
    """A client of the Redis the run used, for reading what it left: the server at `redis.url` (a deployment's,
    external to the run: read as it is, nothing started or stopped), else the run's embedded server started again on
    its data directory RUN_DIR/redis for the reading, and stopped after. FileNotFoundError when the run has neither
    (an embedded run that left no data directory)."""
    from services.redis_server import make_client, start_embedded

    if cfg.redis.url:
        client = make_client(cfg.redis.url)
        try:
            yield client
        finally:
            client.close()
        return
    if not (run_dir / "redis").is_dir():
        raise FileNotFoundError(f"the run left no Redis data directory ({run_dir / 'redis'}) and names no redis.url")
    with start_embedded(run_dir / "redis", appendonly=True, maxmemory_mb=0) as server:
        yield server.client()


def read_redis(data_dir: Path, run: str) -> tuple[dict[str, dict], list[dict]]:
    """`read_streams` of the run's Redis data directory (a server started on it for the reading, then stopped)."""
    from services.redis_server import start_embedded

    with start_embedded(data_dir, appendonly=True, maxmemory_mb=0) as server:
        return read_streams(server.client(), run)


def read_streams(client, run: str) -> tuple[dict[str, dict], list[dict]]:
    """What `client`'s Redis holds of the run's work streams: each declared stream's state with the entry counts
    the run kept (services/streams/counts.py: exists, its group exists, length, pending, unread, counts), and
    every dead letter ({"stream", "payload", "error"}). Any Redis the run used: the embedded one's data
    directory started again (`read_redis`), or a deployment's server."""
    from services.streams.counts import stream_state
    from services.streams.topology import STREAMS, stream_key

    streams, dead = {}, []
    for stream in STREAMS:
        key = stream_key(run, stream.name)
        streams[stream.name] = stream_state(client, key, stream.group)
        for _, fields in client.xrange(f"{key}:dead"):
            dead.append({"stream": stream.name, "payload": fields.get(b"payload", b""),
                         "error": fields.get(b"error", b"").decode(errors="replace")})
    return streams, dead


@dataclass
class RunReading:
    """What the invariants over a finished run read (`entrypoints.chaos.check.run_checks`)."""

    metrics: list[dict]  # metrics.jsonl's lines
    selections: list[dict]  # selections.jsonl's lines
    trackers: dict[str, list[int]] | None  # read_tracker_steps
    streams: dict[str, dict] | None = None  # read_streams; None when the run's Redis could not be read
    dead: list[dict] = field(default_factory=list)  # the dead letters
    incarnations: list[dict] | None = None  # the actors' incarnation registry (services/incarnations.py)
    redis_error: str = ""  # why the run's Redis could not be read


def read_run(cfg, run_dir: Path) -> RunReading:
    """Everything the invariants over a finished run read: its records, its tracker's steps and what its Redis
    holds (`run_redis`: a deployment's at redis.url, or the embedded one's data directory)."""
    import redis

    from services.incarnations import read_incarnations

    metrics, selections = read_records(run_dir)
    reading = RunReading(metrics, selections, read_tracker_steps(run_dir))
    try:
        with run_redis(cfg, run_dir) as client:
            reading.streams, reading.dead = read_streams(client, cfg.run.name)
            reading.incarnations = read_incarnations(client, cfg.run.name)
    except (FileNotFoundError, redis.RedisError) as exc:
        reading.redis_error = f"the run's Redis could not be read: {exc}"
    return reading
