"""What a chaos run reads once its run has ended, for the invariants (`pcl.tools.chaos_checks`): the run's records
(metrics.jsonl, selections.jsonl), what its experiment tracker holds, and its Redis as the run left it.

    streams, dead = read_redis(run_dir / "redis", "chaos")   # the embedded server started again on its data
    metrics, selections = read_records(run_dir)
    scalars = read_tracker_steps(run_dir)                     # TensorBoard: figure -> the steps written, in order

The embedded Redis stops with its run; with AOF on (the embedded default) its data directory holds everything
it acknowledged, so a server started again on that directory shows the streams, their consumer groups' pending
entries and the dead letters exactly as the run left them.
"""

from __future__ import annotations

from pathlib import Path

from pcl.loop.runlog import METRICS_FILE, SELECTIONS_FILE, read_metrics


def read_records(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """Every complete line of metrics.jsonl and selections.jsonl (none when a file is missing)."""
    def lines(name: str) -> list[dict]:
        path = run_dir / name
        return read_metrics(path) if path.is_file() else []

    return lines(METRICS_FILE), lines(SELECTIONS_FILE)


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


def read_redis(data_dir: Path, run: str) -> tuple[dict[str, dict], list[dict]]:
    """Each work stream's entries and its group's pending count, and every dead letter, from the run's Redis data
    directory (a server started on it for the reading, then stopped)."""
    from services.redis_server import start_embedded
    from services.streams.topology import STREAMS, stream_key

    streams, dead = {}, []
    with start_embedded(data_dir, appendonly=True, maxmemory_mb=0) as server:
        client = server.client()
        for stream in STREAMS:
            key = stream_key(run, stream.name)
            pending = 0
            if client.exists(key):
                groups = {_text(g["name"]): g for g in client.xinfo_groups(key)}
                pending = int(groups[stream.group]["pending"]) if stream.group in groups else 0
            streams[stream.name] = {"pending": pending, "length": int(client.xlen(key))}
            for _, fields in client.xrange(f"{key}:dead"):
                dead.append({"stream": stream.name, "payload": fields.get(b"payload", b""),
                             "error": fields.get(b"error", b"").decode(errors="replace")})
    return streams, dead


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
