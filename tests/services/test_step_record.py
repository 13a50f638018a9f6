"""The step record (`pcl.loop.record.StepRecord`) is the one place a step metric is declared: every field, and a
field added to it (a plain number, and a dict-valued figure by worker), reaches Prometheus, the control history,
the status, the trackers and metrics.jsonl, through the real control state on Redis."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pcl.loop import record as record_module
from pcl.loop.record import FIGURES, STEP_KEYS, Figure, StepRecord
from pcl.loop.runlog import MetricsLog, read_metrics, read_records
from services.control.metrics import metric_name, metrics_registry, step_metrics
from services.control.run import RunControl
from services.tracking.trackers import NOT_METRICS, tracker_key, tracker_metrics
from tests.services.control_fixtures import api, server, store  # noqa: F401 - fixtures

pytestmark = pytest.mark.redis


def every_field() -> StepRecord:
    """A training step's record with every field set, each to its own value (counters whole numbers, a labelled
    figure a dict of two)."""
    values = {name: (i + 1 if fig.kind in ("counter", "status") else 0.5 + i) for i, (name, fig) in
              enumerate(FIGURES.items())}
    values.update({name: {"w0": values[name], "w1": values[name] + 1} for name, fig in FIGURES.items() if fig.label})
    values.update(step=1, step_seconds=1.5)
    return StepRecord.from_dict(values)


def scrape(store) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics_registry(store)).decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "run"))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def seen_everywhere(store, tmp_path, record: StepRecord) -> tuple[dict, dict, dict, dict]:
    """The record published by the coordinator's side and logged: what Prometheus, the history, the trackers and
    metrics.jsonl then hold."""
    control = RunControl(store, poll_s=0.02)
    try:
        control.publish(record, 1)
        MetricsLog(tmp_path).append(record)
        return scrape(store), store.history()[-1], tracker_metrics(record), read_metrics(tmp_path / "metrics.jsonl")[-1]
    finally:
        control.finish(1)


def test_every_field_of_the_record_reaches_every_reader(store, tmp_path):
    record = every_field()
    samples, history, tracked, line = seen_everywhere(store, tmp_path, record)
    for name, fig in FIGURES.items():
        value = record.get(name)
        assert line[name] == value and history[name] == value, name  # metrics.jsonl, the control history
        if fig.label:  # by label: one series, one tracker key per key of the dict
            for key, v in value.items():
                assert samples[(metric_name(fig), ((fig.label, key),))] == v, name
                assert tracked[f"{tracker_key(name)}/{key}"] == v, name
            continue
        if name not in NOT_METRICS:
            assert tracked[tracker_key(name)] == float(value), name
        if fig.kind == "gauge":
            assert samples[(metric_name(fig), ())] == float(value), name
        elif fig.kind == "counter":
            assert samples[(metric_name(fig), ())] == value, name
        elif fig.kind == "histogram":
            assert samples[(f"{metric_name(fig)}_count", ())] == 1 and samples[(f"{metric_name(fig)}_sum", ())] == value
    assert store.status()["last_step"]["effective_ratio"] == record.effective_ratio
    assert set(step_metrics()) == {metric_name(f) for f in FIGURES.values() if f.kind != "status"}
    assert read_records(tmp_path / "metrics.jsonl") == [record]  # back to the same record


def test_a_field_added_to_the_record_appears_on_every_reader(store, tmp_path, monkeypatch):
    """What adding a field does: a number, and a dict-valued figure by worker (Prometheus: a labelled gauge)."""
    for fig in (Figure("learner_padding_share", "Share of padding tokens in the last step's batch."),
                Figure("samples_by_worker", "Samples each rollout worker generated in the last step.",
                       label="worker")):
        monkeypatch.setitem(record_module.FIGURES, fig.name, fig)
    record = every_field()
    record.update({"learner_padding_share": 0.125, "samples_by_worker": {"0": 40, "1": 24}})
    samples, history, tracked, line = seen_everywhere(store, tmp_path, record)
    assert samples[("pcl_learner_padding_share", ())] == 0.125
    assert samples[("pcl_samples_by_worker", (("worker", "0"),))] == 40
    assert samples[("pcl_samples_by_worker", (("worker", "1"),))] == 24
    assert history["samples_by_worker"] == {"0": 40, "1": 24} and history["learner_padding_share"] == 0.125
    assert tracked["pcl/samples_by_worker/0"] == 40 and tracked["pcl/learner_padding_share"] == 0.125
    assert line["samples_by_worker"] == {"0": 40, "1": 24} and line["learner_padding_share"] == 0.125


def test_a_dict_valued_counter_counts_each_key(store, monkeypatch):
    monkeypatch.setitem(record_module.FIGURES, "tokens_by_worker",
                        Figure("tokens_by_worker", "Tokens each worker generated, all steps.", "counter",
                               label="worker"))
    control = RunControl(store, poll_s=0.02)
    try:
        for step, counts in ((1, {"0": 10, "1": 5}), (2, {"0": 30, "1": 5})):
            control.publish(StepRecord(step=step, step_seconds=1.0, extra={"tokens_by_worker": counts}), step)
    finally:
        control.finish(2)
    samples = scrape(store)
    assert samples[("pcl_tokens_by_worker_total", (("worker", "0"),))] == 30
    assert samples[("pcl_tokens_by_worker_total", (("worker", "1"),))] == 5


def test_the_policy_steps_a_run_skipped_are_a_prometheus_counter(store, tmp_path):
    """The records of a run on the in-memory fakes whose learner skips steps 2 and 3 of 4, published as the
    coordinator publishes them: /metrics counts the skipped steps and shows whether the last one was skipped."""
    from tests.pcl.loop.test_skipped_steps import fleet_with

    fleet = fleet_with(tmp_path, skips={2, 3}, steps=4)
    fleet.run.run()
    control = RunControl(store, poll_s=0.02)
    try:
        for record in fleet.control.published:
            control.publish(record, record.step)
    finally:
        control.finish(4)
    samples = scrape(store)
    assert FIGURES["policy_skipped_steps_total"].kind == "counter"
    assert samples[("pcl_policy_skipped_steps_total", ())] == 2 and samples[("pcl_policy_skipped", ())] == 0


def test_no_two_figures_share_a_prometheus_family():
    """A counter `x_total` is the family `pcl_x`: a gauge `x` beside it would be a second family of that name."""
    families = [fig.prometheus_name for fig in FIGURES.values()]
    assert len(families) == len(set(families)), sorted(f for f in families if families.count(f) > 1)


def test_lines_of_old_runs_read_back_with_the_same_keys(tmp_path):
    """metrics.jsonl keeps its key names: a line written before the record existed reads into it and back."""
    old = {"step": 3, "effective_ratio": 0.5, "train_reward_mean": 0.25, "generation_seconds": 1.0,
           "selection_seconds": 0.1, "train_seconds": 0.2, "weight_sync_seconds": 0.05, "step_seconds": 1.4,
           "selected_value_mean": None, "value_explained_variance": None, "tau": 0.5, "speed_rounds": 2.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(old) + "\n" + json.dumps({"step": 0, "eval_accuracy": 0.2})
                                            + "\n")
    first, second = read_records(tmp_path / "metrics.jsonl")
    assert first.effective_ratio == 0.5 and first.extra == {"tau": 0.5, "speed_rounds": 2.0}
    assert {k: v for k, v in first.to_dict().items() if k in old} == old and set(STEP_KEYS) <= set(first.to_dict())
    assert second.to_dict() == {"step": 0, "eval_accuracy": 0.2}  # the step-0 evaluation: nothing added


def test_the_api_serves_the_records_fields_for_the_dashboard(api):
    fields = api.get("/v1/fields").json()["fields"]
    assert [f["name"] for f in fields] == list(FIGURES)
    assert all(f["help"] and f["kind"] in ("gauge", "counter", "histogram", "status") for f in fields)
    assert "/v1/fields" in api.get("/").text  # the dashboard's figure list
