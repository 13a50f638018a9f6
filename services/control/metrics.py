"""Prometheus metrics of a run, read from its control state in Redis at every scrape.

    registry = metrics_registry(store)         # a CollectorRegistry holding one RunCollector
    text = generate_latest(registry)           # what GET /metrics serves

Nothing is kept in the serving process: gauges come from the status the coordinator published, counters and
histograms from the run's totals hash (accumulated by the coordinator, step by step), queue depths from the
streams themselves. So a control plane started late, or restarted, serves the same numbers, and counters never
go back. While Redis is unreachable a scrape is the last good reading, with `pcl_control_store_up` 0 (a
scrape with no reading yet fails: 503). Every series carries the label `run`; `pcl_queue_depth` also `stream` (one
of three names), a dict-valued figure its own label (e.g. `worker`). Every figure of the step record (`pcl.loop.record.StepRecord`) is a series:
its `kind` says which (a gauge of the last step, a counter, a histogram).
"""

from __future__ import annotations

import math
from typing import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from pcl.loop.record import FIGURES, Figure, StepRecord, check_keys
from services.control.outage import Readings
from services.control.reads import ControlReader

# Histograms of step phases (the step record's `histogram` figures); buckets from a tenth of a second (the tiny
# run) to an hour (large models).
HISTOGRAM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)  # seconds

# The control plane's own metrics: name -> (type, help). The step record's figures add theirs (`step_metrics`).
CONTROL_METRICS: dict[str, tuple[str, str]] = {
    "pcl_step": ("gauge", "Training steps completed."),
    "pcl_policy_version": ("gauge", "Version of the policy the rollout workers serve."),
    "pcl_paused": ("gauge", "1 while the run is paused at a step boundary, else 0."),
    "pcl_tau": ("gauge", "Target pass rate tau of PCL selection, as applied to the current step."),
    "pcl_k": ("gauge", "Candidate pool factor k of PCL selection (k*m candidates are scored)."),
    "pcl_coordinator_up": ("gauge", "1 while the coordinator's heartbeat is fresh, else 0."),
    "pcl_control_store_up": ("gauge", "1 while the control plane reads the run's state from Redis; 0 while Redis is "
                             "unreachable and the other series are the last good reading."),
    "pcl_eval_accuracy": ("gauge", "Held-out accuracy at the last evaluation."),
    "pcl_queue_depth": ("gauge", "Entries of a work stream not yet acknowledged by its consumer group."),
    "pcl_redis_memory_used_bytes": ("gauge", "Memory Redis uses (INFO memory: used_memory)."),
    "pcl_redis_memory_max_bytes": (
        "gauge",
        "Redis maxmemory; 0 when unlimited. Used at max: writes are refused and the workers pause until it frees.",
    ),
}
# The step figures deploy/grafana/pcl-dashboard.json draws (tests/services/test_monitoring.py: a panel each).
DASHBOARD_FIGURES = ("effective_ratio", "train_reward_mean", "selected_value_mean", "value_explained_variance",
                     "samples_total", "generated_tokens_total", "verifier_timeouts_total", "verifier_errors_total",
                     "generation_seconds", "selection_seconds", "step_seconds", "weight_sync_seconds",
                     # whether the curriculum pays (pcl/loop/curriculum_window.py)
                     "uniform_effective_ratio", "expected_effective_ratio", "curriculum_gain", "expectation_gap",
                     "probe_calibration_error", "trained_calibration_error", "probe_brier", "trained_brier",
                     "probe_reliability_predicted", "probe_reliability_realized", "pool_histogram",
                     "selected_band_width", "curriculum_stalled", "curriculum_stalled_steps_total")
check_keys(DASHBOARD_FIGURES, "services.control.metrics.DASHBOARD_FIGURES")


def metric_name(fig: Figure) -> str:
    """A figure's series name as scraped (a counter's with `_total`)."""
    return f"{fig.prometheus_name}_total" if fig.kind == "counter" else fig.prometheus_name


def step_metrics() -> dict[str, tuple[str, str]]:
    """Every figure of the step record on /metrics: series name -> (type, help); `status` figures (step, policy
    version, held-out accuracy) are the control plane's own."""
    return {metric_name(fig): (fig.kind, fig.help) for fig in FIGURES.values() if fig.kind != "status"}


# Every metric a dashboard may rely on: name -> (type, help).
METRICS: dict[str, tuple[str, str]] = {
    **CONTROL_METRICS, **{metric_name(FIGURES[key]): step_metrics()[metric_name(FIGURES[key])]
                          for key in DASHBOARD_FIGURES}}


class RunCollector(Collector):
    """Builds every pcl_ metric family of one run from Redis, at collection time."""

    def __init__(self, store: ControlReader, readings: Readings | None = None):
        self.store, self.readings = store, readings or Readings()

    def reading(self, wait_s: float | None = None) -> tuple[tuple[dict, dict[str, float]], dict | None]:
        """((status, totals), stale): from Redis, or while it is unreachable the last good reading (`Readings`)."""
        return self.readings.read("metrics", lambda: (self.store.status(), self.store.totals()), wait_s)

    def collect(self) -> Iterator[Metric]:
        run = self.store.run
        (status, totals), stale = self.reading()
        yield _family("pcl_control_store_up", CONTROL_METRICS["pcl_control_store_up"][1],
                      [({"run": run}, 0.0 if stale else 1.0)])
        gauges = {
            "pcl_step": status.get("step"),
            "pcl_policy_version": status.get("policy_version"),
            "pcl_paused": float(bool(status.get("paused"))),
            "pcl_tau": status.get("tau"),
            "pcl_k": status.get("k"),
            "pcl_coordinator_up": float(status["coordinator"]["alive"]),
            "pcl_eval_accuracy": (status.get("eval") or {}).get("accuracy"),
        }
        for name, value in gauges.items():
            if value is not None:
                yield _family(name, CONTROL_METRICS[name][1], [({"run": run}, float(value))])
        if not stale:
            yield from _redis_memory(self.store, run)
        depths = status["queue_depths"]
        yield _family("pcl_queue_depth", CONTROL_METRICS["pcl_queue_depth"][1],
                      [({"run": run, "stream": s}, float(d)) for s, d in depths.items()])
        yield from step_families(status.get("last_step") or {}, totals, run)


def step_families(last: dict, totals: dict[str, float], run: str) -> Iterator[Metric]:
    """The step record's figures: a gauge of the last step's value (by label for a dict-valued figure), a counter
    of the run's total, a histogram of the run's steps."""
    for fig in FIGURES.values():
        if fig.kind == "gauge" and last.get(fig.name) is not None:
            value = last[fig.name]
            if isinstance(value, dict):
                label = fig.label or "key"
                samples = [({"run": run, label: str(k)}, float(v)) for k, v in value.items() if v is not None]
                yield _family(fig.prometheus_name, fig.help, samples, ["run", label])
            else:
                yield _family(fig.prometheus_name, fig.help, [({"run": run}, float(value))])
        elif fig.kind == "counter":
            label = fig.label or "key"
            family = CounterMetricFamily(fig.prometheus_name, fig.help, labels=["run", label] if fig.label else ["run"])
            labelled = {k.split("|", 1)[1]: v for k, v in totals.items() if k.startswith(f"{fig.name}|")}
            if fig.label:
                for key, value in sorted(labelled.items()):
                    family.add_metric([run, key], value)
            else:
                family.add_metric([run], totals.get(fig.name, 0.0))
            yield family
        elif fig.kind == "histogram":
            family = HistogramMetricFamily(fig.prometheus_name, fig.help, labels=["run"])
            buckets, running = [], 0.0
            for le in (*HISTOGRAM_BUCKETS, math.inf):
                running += totals.get(bucket_field(fig.name, le), 0.0)
                buckets.append(("+Inf" if le == math.inf else repr(float(le)), running))
            family.add_metric([run], buckets, sum_value=totals.get(f"{fig.name}_sum", 0.0))
            yield family


def _family(name: str, help_: str, samples: list[tuple[dict[str, str], float]],
            labels: list[str] | None = None) -> GaugeMetricFamily:
    labels = labels or (list(samples[0][0]) if samples else ["run"])
    family = GaugeMetricFamily(name, help_, labels=labels)
    for label_values, value in samples:
        family.add_metric([label_values[label] for label in labels], value)
    return family


def _redis_memory(store: ControlReader, run: str) -> Iterator[Metric]:
    """Redis's memory in use and its maxmemory: a full Redis is backpressure (services.streams.queues), seen here."""
    try:
        info = store.client.info("memory")
    except Exception:  # noqa: BLE001 - a server that refuses INFO (ACL) shows no memory gauges
        return
    for name, key in (("pcl_redis_memory_used_bytes", "used_memory"), ("pcl_redis_memory_max_bytes", "maxmemory")):
        yield _family(name, CONTROL_METRICS[name][1], [({"run": run}, float(info.get(key, 0)))])


def metrics_registry(store: ControlReader, readings: Readings | None = None) -> CollectorRegistry:
    """A registry of its own (not the process-wide default), so several runs can be served side by side;
    `readings` keeps the last good reading (the app's, shared with its other reads)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(store, readings))
    return registry


def bucket_field(name: str, le: float) -> str:
    """Field of the totals hash holding the count of `name` observations in the bucket ending at `le`."""
    return f"{name}_bucket:{'+Inf' if le == math.inf else repr(float(le))}"


def observation_increments(record: StepRecord, counted: dict[str, float]) -> dict[str, float]:
    """Totals-hash increments for one step record: an observation of each `histogram` figure, and each `counter`
    figure's increase since `counted` (updated in place; a counter that went down restarted). A dict-valued
    counter counts each key apart (totals field `name|key`)."""
    out: dict[str, float] = {}
    for fig in FIGURES.values():
        value = record.get(fig.name)
        if value is None:
            continue
        if fig.kind == "histogram" and math.isfinite(value):
            le = next((b for b in HISTOGRAM_BUCKETS if value <= b), math.inf)
            out[bucket_field(fig.name, le)] = 1
            out[f"{fig.name}_sum"] = float(value)
        elif fig.kind == "counter":
            items = {f"{fig.name}|{k}": v for k, v in value.items()} if isinstance(value, dict) else {fig.name: value}
            for name, count in items.items():
                count = int(count)
                increase = count - counted.get(name, 0) if count >= counted.get(name, 0) else count
                counted[name] = count
                if increase:
                    out[name] = increase
    return out
