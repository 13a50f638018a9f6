"""Experiment trackers: each committed step's metrics, the run's config, tau / k retunes and the final summary,
sent to the trackers named in `logging.backends` (TensorBoard, wandb, MLflow, trackio), for comparing runs.

RUN_DIR/metrics.jsonl stays the record of the run (the `jsonl` backend, always on); the driver hands each new
record of it to a `Trackers` hub, which maps it to slash-namespaced keys (`pcl/effective_ratio`,
`timing_s/generation`, `value/explained_variance`, `eval/held_out`, `eval/<benchmark>`) and commits them once,
at the record's step: one monotonic global step per run.

    check_backends(cfg)                               # before any actor: a missing library is a ConfigError
    trackers = Trackers.open(cfg, run_dir)            # a resumed run reopens the same tracker runs
    trackers.commit(record); trackers.event(...)      # per step, per control-plane change
    trackers.finish(summary)

The tracker run ids and the last step committed are kept in RUN_DIR/trackers.json (copied into every
checkpoint), so a resumed or restarted run continues the same tracker runs and never writes a step twice: steps
a restart goes back over keep the values first committed (metrics.jsonl has the rewritten ones).
Each library is imported only inside its own adapter, only when named.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from pcl.config import Config, ConfigError
from pcl.loop.record import StepRecord, check_keys
from services.tracking.backends import ADAPTERS, flat_config

TRACKERS_FILE = "trackers.json"
# backend -> (module that must be importable, the pip extra that installs it)
LIBRARIES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
             "mlflow": ("mlflow", "mlflow"), "trackio": ("trackio", "trackio")}
RELAYED_EVENTS = {"params_applied", "params_refused", "paused", "resumed", "checkpoint_written"}
NOT_METRICS = {"step", "policy_version"}  # the global step itself, and a counter that equals it
check_keys(NOT_METRICS, "services.tracking.trackers.NOT_METRICS")


def check_backends(cfg: Config) -> None:
    """A ConfigError naming the extra to install for each tracker named in logging.backends but not installed."""
    missing = [(name, *LIBRARIES[name]) for name in cfg.logging.backends
               if name in LIBRARIES and importlib.util.find_spec(LIBRARIES[name][0]) is None]
    if missing:
        raise ConfigError("\n  ".join(
            [f"logging.backends names {len(missing)} tracker(s) that are not installed:"] +
            [f"{name}: no module {module!r}; pip install 'pcl-service[{extra}]'" for name, module, extra in missing]))


def tracker_key(name: str) -> str:
    """A metrics.jsonl key as the trackers show it: grouped by what it measures."""
    if name.endswith("_seconds"):
        return f"timing_s/{name[: -len('_seconds')]}"
    if name == "eval_accuracy":
        return "eval/held_out"
    if name.startswith("suite_"):
        return f"eval/{name[len('suite_'):]}"
    if name.startswith("value_"):
        return f"value/{name[len('value_'):]}"
    if name == "selected_value_mean":
        return "value/selected_mean"
    if name in ("tau", "k"):
        return f"control/{name}"
    return f"pcl/{name}"


def tracker_metrics(record: StepRecord | dict) -> dict[str, float]:
    """The finite numbers of a step record (`pcl.loop.record.StepRecord`, or a metrics.jsonl line) under their
    tracker keys, a dict-valued figure one key per entry (`pcl/<name>/<key>`); None, NaN, strings and lists left
    out."""
    out = {}
    for name, value in _line(record).items():
        if name in NOT_METRICS:
            continue
        values = {f"{tracker_key(name)}/{k}": v for k, v in value.items()} if isinstance(value, dict) else {
            tracker_key(name): value}
        for key, v in values.items():
            if not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v):
                out[key] = float(v)
    return out


def _line(record: StepRecord | dict) -> dict:
    return record.to_dict() if isinstance(record, StepRecord) else record


class Trackers:
    """The trackers of one run: opened once by the driver, fed each committed step, finished at the end."""

    def __init__(self, run_dir: Path, adapters: dict[str, Any], state: dict):
        self.run_dir, self.adapters, self.state = run_dir, adapters, state
        self.failures: dict[str, int] = {}  # tracker -> calls that raised

    @classmethod
    def open(cls, cfg: Config, run_dir: str | os.PathLike, resume: bool = False,
             checkpoint: Path | None = None) -> "Trackers":
        """Start each named tracker: new tracker runs, or with `resume` the ones named in RUN_DIR/trackers.json
        (or the checkpoint's copy)."""
        run_dir = Path(run_dir)
        state = read_state(run_dir, checkpoint) if resume else {}
        ids = state.setdefault("ids", {})
        trackers = cls(run_dir, {}, state)
        for name in cfg.logging.backends:
            if name not in LIBRARIES:
                continue
            try:  # no login, a server out of reach, a bad URI: named before any actor starts
                trackers.adapters[name] = ADAPTERS[name](cfg, run_dir, ids.get(name))
            except Exception as exc:  # noqa: BLE001 - any library's error, reported as a configuration problem
                trackers.close(failed=True)
                why = " ".join(str(exc).split())[:300] or type(exc).__name__
                raise ConfigError(f"logging.backends: {name} could not start its run: {why}") from None
            ids[name] = trackers.adapters[name].run_id
        trackers.save()
        if not state.get("config_logged"):
            trackers._each("log_config", flat_config(cfg))
            state["config_logged"] = True
            trackers.save()
        return trackers

    @property
    def last_step(self) -> int:
        return int(self.state.get("last_step", -1))

    def commit(self, record: StepRecord | dict) -> bool:
        """Send one metrics record at its step; False (nothing sent) for a step at or before the last one sent."""
        record = _line(record)
        step = int(record.get("step", -1))
        if step <= self.last_step or not self.adapters:
            return False
        self._each("log", tracker_metrics(record), step)
        self.state["last_step"] = step
        self.save()
        return True

    def catch_up(self, records) -> int:
        """Send the step records the trackers never got: metrics.jsonl's records after the last step sent (a driver
        stopped between writing a record and sending it, then resumed past it from a checkpoint). Returns how many
        were sent."""
        return sum(self.commit(record) for record in records)

    def event(self, step: int | None, kind: str, data: dict) -> None:
        """A control-plane change (tau / k retuned, pause, resume) as an annotation at the step it took effect."""
        text = f"{kind} " + " ".join(f"{k}={v}" for k, v in sorted(data.items()))
        self._each("annotate", max(step or 0, self.last_step), kind, text.strip())

    def relay(self, store: Any) -> None:
        """Forward the control state's new events (`ControlStore`: tau / k applied, pauses) to the trackers,
        each once: the last one relayed is kept in RUN_DIR/trackers.json."""
        if not self.adapters:
            return
        after = self.state.get("last_event")
        try:
            events = store.events(after=after, limit=1000) if after else store.events(limit=1000)
        except Exception:  # noqa: BLE001 - Redis briefly away: the events wait for the next poll
            return
        for event in events:
            if event["type"] in RELAYED_EVENTS:
                self.event(event["step"], event["type"], event["data"])
            self.state["last_event"] = event["id"]
        if events:
            self.save()

    def finish(self, summary: dict) -> None:
        """The run's summary (`pcl summary`'s figures) to each tracker, and every tracker run closed."""
        figures = {k: float(v) for k, v in summary.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        self._each("summary", figures, max(self.last_step, 0))
        self.close()

    def _each(self, method: str, *args: Any) -> None:
        """Call every tracker; one that fails (its server away, a full disk) is reported on stderr and the run
        goes on: the tracker is a copy of metrics.jsonl, not the record of the run."""
        for name, adapter in self.adapters.items():
            try:
                getattr(adapter, method)(*args)
            except Exception as exc:  # noqa: BLE001
                self.failures[name] = self.failures.get(name, 0) + 1
                if self.failures[name] in (1, 10, 100, 1000):
                    print(f"pcl: warning: tracker {name}: {method} failed ({type(exc).__name__}: "
                          f"{str(exc)[:200]}); {self.failures[name]} failure(s) so far; training goes on",
                          file=sys.stderr, flush=True)

    def close(self, failed: bool = False) -> None:
        """Close every tracker run, marked failed when the run stopped on an error."""
        for adapter in self.adapters.values():
            try:
                adapter.close(failed)
            except Exception:  # noqa: BLE001 - a tracker that fails to flush must not hide the run's own result
                pass
        self.adapters = {}

    def save(self) -> None:
        tmp = self.run_dir / (TRACKERS_FILE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=2) + "\n")
        os.replace(tmp, self.run_dir / TRACKERS_FILE)


def read_state(run_dir: Path, checkpoint: Path | None) -> dict:
    """RUN_DIR/trackers.json (the newest: it knows the last step sent), else the checkpoint's copy, else {}."""
    for path in (run_dir / TRACKERS_FILE, (checkpoint / TRACKERS_FILE) if checkpoint else None):
        if path is not None and path.is_file():
            try:
                state = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(state, dict):
                return state
    return {}
