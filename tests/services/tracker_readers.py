"""Read back what each experiment tracker stored, with the library's own reader where it has one, as
{run id: {key: {step: value}}}: TensorBoard's EventAccumulator, the MLflow client, trackio's SQLite storage, and
wandb's offline run files (`RUN_DIR/wandb/offline-run-*/run-ID.wandb`: a log of protobuf `Record`s in
32 KiB blocks, each chunk behind a 7-byte header: CRC, length, type), parsed with wandb's own protobuf classes.
Also the environment that keeps every tracker on this machine."""

from __future__ import annotations

import json
import os
import struct
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# trackio reads TRACKIO_DIR once, when first imported: one temporary database directory for the test session
# (the tests tell their runs apart by project name).
os.environ.setdefault("TRACKIO_DIR", tempfile.mkdtemp(prefix="pcl-test-trackio-"))
OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
               "WANDB_DISABLE_CODE": "true"}


def offline_env(monkeypatch) -> None:
    """Every tracker offline and local: wandb offline, trackio in a temporary database, no MLflow server."""
    for key, value in OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, list[float]]]:
    """tag -> step -> every value written at that step (a step written twice shows as two values)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    out: dict[str, dict[int, list[float]]] = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            out.setdefault(tag, {}).setdefault(event.step, []).append(event.value)
    return out


def tensorboard_texts(log_dir: Path) -> dict[str, list[str]]:
    """text tag -> the texts written under it (the config, the events, the summary)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag.removesuffix("/text_summary"): [b"".join(e.tensor_proto.string_val).decode() for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"] if tag.endswith("/text_summary")}


def mlflow_runs(uri: str, experiment: str) -> dict[str, dict]:
    """run id -> {"metrics": {key: {step: [values]}}, "params": {...}, "tags": {...}, "status": ...}."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    out = {}
    for run in client.search_runs([exp.experiment_id]):
        metrics: dict[str, dict[int, list[float]]] = {}
        for key in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, key):
                metrics.setdefault(key, {}).setdefault(m.step, []).append(m.value)
        out[run.info.run_id] = {"metrics": metrics, "params": run.data.params, "tags": run.data.tags,
                                "status": run.info.status}
    return out


def _wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", f"{path}: not a wandb run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _wandb_closed(path: Path) -> bool:
    return any(r.WhichOneof("record_type") == "exit" for r in _wandb_records(path))


def wandb_offline_runs(wandb_dir: Path, wait_s: float = 60.0) -> dict[str, dict]:
    """run id -> {"history": {key: {step: [values]}}, "config": {key: value}, "summary": {key: value},
    "files": number of offline run directories of that id}. wandb's service process writes a run's file after
    `finish()` returns: this waits (up to wait_s) for each file's closing `exit` record."""
    paths = sorted(wandb_dir.glob("offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + wait_s
    while not all(_wandb_closed(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.2)
    runs: dict[str, dict] = defaultdict(lambda: {"history": {}, "config": {}, "summary": {}, "files": 0})
    for path in paths:
        run_id = path.stem[len("run-"):]
        run = runs[run_id]
        run["files"] += 1
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                step = record.history.step.num
                media: dict[str, dict] = {}  # a media object's fields come as nested keys: {key: {field: value}}
                for item in record.history.item:
                    if len(item.nested_key) > 1:
                        media.setdefault("/".join(item.nested_key[:-1]), {})[item.nested_key[-1]] = \
                            json.loads(item.value_json)
                    elif not (key := item.key or item.nested_key[0]).startswith("_"):
                        run["history"].setdefault(key, {}).setdefault(step, []).append(json.loads(item.value_json))
                for key, fields in media.items():
                    fields["file"] = path.parent / "files" / fields.get("path", "")
                    run["history"].setdefault(key, {}).setdefault(step, []).append(fields)
            elif kind == "config":
                for item in record.config.update:
                    run["config"][item.key] = json.loads(item.value_json)
            elif kind == "summary":
                for item in record.summary.update:
                    key = item.key or "/".join(item.nested_key)
                    run["summary"][key] = json.loads(item.value_json)
    return dict(runs)


def trackio_runs(project: str) -> dict[str, dict[str, dict[int, list[float]]]]:
    """run name -> key -> step -> values, from trackio's local database (TRACKIO_DIR)."""
    from trackio.sqlite_storage import SQLiteStorage

    out = {}
    for run in SQLiteStorage.get_runs(project):
        metrics: dict[str, dict[int, list[float]]] = {}
        for row in SQLiteStorage.get_logs(project, run):
            for key, value in row.items():
                if key not in ("step", "timestamp") and isinstance(value, (int, float)):
                    metrics.setdefault(key, {}).setdefault(row["step"], []).append(value)
        out[run] = metrics
    return out
