"""The curriculum's figures pooled over the last steps (`pcl.loop.curriculum_window`): by hand on small batches,
then through the step loop on the in-memory fakes (V's version and lag in synchronous, pipelined and asynchronous
steps; the reliability tables in the run directory; nothing for a strategy without V)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from pcl.data.prompts import PromptRecord
from pcl.loop.curriculum import realized_effective_ratio
from pcl.loop.curriculum_window import CurriculumWindow
from pcl.loop.rounds import RoundLedger, StepBatch
from pcl.loop.runlog import read_metrics
from tests.pcl.loop.fakes import FakeFleet, config
from tests.pcl.loop.test_async_steps import async_config, with_engine_logprobs

PCL = {"type": "pcl", "tau": 0.5, "k": 2}


def batch(version: int, value_version: int | None, trained: dict[str, float], probe: dict[str, tuple[float, float]],
          tau: float = 0.5) -> StepBatch:
    """A step's batch: the trained prompts' V, the probe's (V, realised rate), scored in one round into 2 bins."""
    b = StepBatch(RoundLedger(), version=version)
    b.prompts = [PromptRecord(i, i, "1", i, (1,)) for i in trained]
    scored = {**trained, **{i: v for i, (v, _) in probe.items()}}
    b.add_scores([PromptRecord(i, i, "1", i, (1,)) for i in scored], np.array(list(scored.values())), value_version,
                 bins=2, tau=tau)
    b.probe_ids, b.probe_rates = list(probe), [p for _, p in probe.values()]
    return b


def window(**settings) -> CurriculumWindow:
    return CurriculumWindow(**{"window": 2, "n": 2, "bins": 2, "min_gain": 0.05, "patience": 2, **settings})


def test_one_steps_figures_by_hand():
    w = window()
    first = batch(0, None, {"a": 0.2, "b": 0.6}, {"c": (0.5, 0.5), "d": (0.9, 1.0)})
    f = w.add(1, first, np.array([0.0, 0.5]), effective_ratio=0.5)

    assert f["value_version"] is None and f["value_lag"] is None  # V had not trained yet
    assert f["pool_histogram"] == {"0-0.5": 1, "0.5-1": 3}  # 0.2 | 0.6, 0.5, 0.9
    assert f["selected_band_width"] == pytest.approx(0.3)  # |0.2 - 0.5|
    assert f["expected_effective_ratio"] == pytest.approx(0.40)  # n = 2: 2 V (1 - V) = 0.32 and 0.48
    # the probe: V 0.5, 0.9 against 0.5, 1.0: Brier (0 + 0.01) / 2; one bin, mean V 0.7 against mean p 0.75
    assert f["probe_brier"] == pytest.approx(0.005) and f["probe_calibration_error"] == pytest.approx(0.05)
    assert f["probe_reliability_count"] == {"0.5-1": 2}
    assert f["probe_reliability_predicted"] == {"0.5-1": pytest.approx(0.7)}
    assert f["probe_reliability_realized"] == {"0.5-1": pytest.approx(0.75)}
    # trained: V 0.2, 0.6 against 0, 0.5: Brier (0.04 + 0.01) / 2; two bins of one: (0.2 + 0.1) / 2
    assert f["trained_brier"] == pytest.approx(0.025) and f["trained_calibration_error"] == pytest.approx(0.15)
    assert "probe_brier_by_lag" not in f and "trained_brier_by_lag" not in f  # no lag known yet
    assert f["uniform_effective_ratio"] == 0.5  # the probe's groups: 0.5 mixed, 1.0 all solved
    assert f["curriculum_gain"] == pytest.approx(0.0) and f["expectation_gap"] == pytest.approx(-0.1)
    assert f["curriculum_stalled"] == 0 and w.below == 1  # below min_gain once: not yet stalled


def test_the_window_pools_its_last_steps_and_splits_by_lag():
    w = window()
    w.add(1, batch(0, None, {"a": 0.2, "b": 0.6}, {"c": (0.5, 0.5), "d": (0.9, 1.0)}), np.array([0.0, 0.5]), 0.5)
    f = w.add(2, batch(1, 0, {"e": 0.5, "f": 0.4}, {}), np.array([0.5, 0.5]), 1.0)

    assert f["value_version"] == 0 and f["value_lag"] == 1
    assert f["probe_brier"] == pytest.approx(0.005)  # step 1's probe, still in the window
    assert f["trained_brier"] == pytest.approx((0.04 + 0.01 + 0.0 + 0.01) / 4)  # both steps' trained prompts
    assert f["trained_brier_by_lag"] == {"1": pytest.approx(0.005)}  # step 2's alone: (0 + 0.01) / 2
    assert "probe_brier_by_lag" not in f  # the only probe had no lag
    assert f["curriculum_gain"] == pytest.approx((0.5 + 1.0) / 2 - 0.5)  # mean realised minus the probe's
    assert f["curriculum_stalled"] == 0 and w.below == 0  # a gain of 0.25 pays: the count restarts

    f = w.add(3, batch(2, 1, {"g": 0.5}, {}), np.array([0.5]), 1.0)
    assert w.pooled("trained")[0] == [0.5, 0.4, 0.5]  # step 1 left the window of 2
    assert f["uniform_effective_ratio"] is None and f["curriculum_gain"] is None  # no probe in the window
    tables = w.tables()
    assert tables["steps"] == [2, 3] and [r["count"] for r in tables["trained"]["all"]] == [1, 2]
    assert tables["trained"]["lag 1"] == tables["trained"]["all"] and tables["probe"]["all"][0]["predicted"] is None


def test_the_gain_below_min_gain_for_patience_steps_stalls_the_curriculum():
    w = window()
    assert [w.observe_gain(g) for g in (0.0, 0.01, None, 0.02, 0.1, 0.0)] == [0, 1, 0, 2, 0, 0]
    assert w.stalled_total == 2  # a step without a gain measured reports 0 and leaves the count as it was
    assert [window(min_gain=None).observe_gain(g) for g in (-1.0, -1.0, -1.0)] == [0, 0, 0]  # never warns


def test_the_step_that_stalls_logs_what_to_change(caplog):
    w = window(patience=1)
    with caplog.at_level(logging.WARNING, logger="pcl.loop.curriculum_window"):
        f = w.add(7, batch(3, 2, {"a": 0.5}, {"c": (0.5, 0.5)}), np.array([1.0]), 0.0, k=2)
    assert f["curriculum_gain"] == pytest.approx(-1.0) and f["curriculum_stalled"] == 1
    assert f["curriculum_stalled_steps_total"] == 1
    [message] = caplog.messages
    assert message.startswith("step 7: the curriculum is not paying") and "-1.000" in message
    assert "curriculum.min_gain = 0.05 for 1 steps" in message and "(tau = 0.5, k = 2)" in message
    assert "raise k" in message and "move tau" in message and "selection.type" in message


def test_the_state_goes_through_json_and_continues_identically():
    a, b = window(), window()
    a.add(1, batch(0, None, {"a": 0.2}, {"c": (0.5, 0.5)}), np.array([0.0]), 0.0)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    step = batch(1, 0, {"e": 0.5}, {"d": (0.9, 1.0)})
    assert a.add(2, step, np.array([0.5]), 1.0) == b.add(2, step, np.array([0.5]), 1.0)
    fresh = window()
    fresh.load_state_dict(None)  # a checkpoint written before the window: empty
    assert fresh.steps == [] and fresh.below == 0


# -- through the step loop, on the fakes -----------------------------------------------------------------------


def test_a_pcl_run_records_the_curriculum_and_writes_its_reliability_tables(tmp_path):
    fleet = FakeFleet(tmp_path, config(PCL, run={"steps": 5}, value={"ev_sample": 6, "ev_every": 2}))
    fleet.run.run()
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "step_seconds" in r]

    assert [r.get("value_lag") for r in records] == [None, 1, 1, 1, 1]  # synchronous: V one step behind
    assert [r.get("value_version") for r in records] == [None, 0, 1, 2, 3]
    assert all(sum(r["pool_histogram"].values()) == 8 for r in records)  # k*m = 8 candidates a step
    assert all(0 <= r["selected_band_width"] <= 0.5 for r in records)
    window = fleet.loop.state.curriculum
    last = records[-1]
    assert last["uniform_effective_ratio"] == realized_effective_ratio(window.pooled("probe")[1])
    assert last["curriculum_gain"] == pytest.approx(
        np.mean([r["effective_ratio"] for r in records[-window.window:]]) - last["uniform_effective_ratio"])
    assert last["curriculum_gain"] > 0  # V is the true pass rate in the fakes: selecting near 0.5 pays
    assert last["probe_brier_by_lag"].keys() == {"1"} and last["curriculum_stalled"] == 0
    tables = json.loads((tmp_path / "calibration.json").read_text())
    assert tables["steps"] == [1, 2, 3, 4, 5] and len(tables["probe"]["all"]) == 10
    assert sum(r["count"] for r in tables["trained"]["all"]) == 5 * 4  # m = 4 trained prompts a step


def test_pipelined_selection_scores_with_v_two_versions_behind(tmp_path):
    fleet = FakeFleet(tmp_path, config({**PCL, "pipelined": True}, run={"steps": 4}))
    fleet.run.run()
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "step_seconds" in r]
    # step 2's candidates were scored during step 1, before V's first step; step 3's during step 2, by V of step 1
    assert [r.get("value_lag") for r in records] == [None, None, 2, 2]


def test_asynchronous_steps_score_with_v_staleness_plus_one_versions_behind(tmp_path):
    fleet = with_engine_logprobs(FakeFleet(tmp_path, async_config(PCL, staleness=1, steps=6)))
    fleet.run.run()
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "step_seconds" in r]
    # step t + 1's batch is selected at step t, before V's step on step t's batch (generated by version t - 1):
    # 2 versions behind from step 4 on; step 3's, selected at step 2 after V trained on step 1's (version 0)
    assert [r.get("value_lag") for r in records] == [None, None, 1, 2, 2, 2]


def test_a_strategy_without_v_records_no_curriculum(tmp_path):
    FakeFleet(tmp_path, config({"type": "uniform"})).run.run()
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "step_seconds" in r]
    assert not any(key in r for r in records for key in ("curriculum_gain", "probe_brier", "pool_histogram"))
    assert not (tmp_path / "calibration.json").exists()
