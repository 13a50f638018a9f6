"""One step of each selection strategy through the loop's ports, on in-memory fakes (no Ray, no Redis)."""

from __future__ import annotations

import math

import pytest

from pcl.engines import SamplingParams
from pcl.strategies.base import Needs, Request, Rollout, StepStrategy
from pcl.loop.runlog import read_metrics
from tests.pcl.loop.fakes import SECONDS_PER_SAMPLE, FakeFleet, closest_to, config, world

M, N = 4, 4
STRATEGIES = {
    "uniform": {"type": "uniform"},
    "pcl": {"type": "pcl", "tau": 0.5, "k": 2},
    "prefilter": {"type": "prefilter", "n_pre": 4, "p_low": 0.0, "p_high": 1.0},
    "dynamic_sampling": {"type": "dynamic_sampling", "k": 2, "max_rounds": 8},
    "speed": {"type": "speed", "k": 2, "n_init": 2, "max_rounds": 4},
    "greso": {"type": "greso", "k": 2, "max_rounds": 8},
    "probe": {"type": "probe", "k": 2, "n_probe": 8, "target_p": 0.5},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_one_step_of_each_strategy_trains_on_m_groups_of_n(tmp_path, name):
    fleet = FakeFleet(tmp_path, config(STRATEGIES[name]), learner_seconds=0.2, value_seconds=0.1)
    record = fleet.loop.train_step(0)

    assert record["step"] == 1 and record["policy_version"] == 1 and fleet.learner.synced == [1]
    assert record["policy_train_seconds"] == pytest.approx(0.2)  # the policy's own step, a part of train_seconds
    assert record["policy_train_seconds"] <= record["train_seconds"]
    assert record["batch_samples"] == record["batch_unique_samples"] == M * N  # each (prompt, index) once
    assert fleet.learner.trained == [(record["train_sequences"], M * N)]  # the loss divides by m*n
    assert record["learner_padding_ratio"] == 0.25  # the learner's per-step padding share reaches the record
    assert 0.0 <= record["effective_ratio"] <= 1.0 and len(fleet.loop.last_ids) == M
    assert record["step_seconds"] >= record["generation_seconds"] > 0
    batch = [c for c in fleet.rollouts.calls if c["tag"] == ""]
    assert record["generation_rounds"] == len(batch)
    assert record["samples_generated"] + record["probe_samples"] == sum(c["samples"] for c in batch)
    if name == "pcl":  # V scored k*m candidates, trained on the m selected pass rates; the probe measured it
        assert fleet.scorer.trained and len(fleet.scorer.trained[0]) == M and record["value_steps"] == 1.0
        assert len(fleet.prompts.drawn[0]) == 2 * M  # k*m candidates
        assert closest_to(0.5, fleet.loop.last_ids, fleet.prompts.drawn[0], fleet.rates)
        assert record["probe_samples"] > 0 and math.isfinite(record["value_explained_variance"])
    else:
        assert not fleet.scorer.trained and record["probe_samples"] == 0 and record["probe_seconds"] == 0.0
    if name == "prefilter":  # the reference pass first (n_pre each), then prompts strictly inside (0, 1)
        reference = [c for c in fleet.rollouts.calls if c["tag"] == "reference"]
        assert reference and sum(c["samples"] for c in reference) == 4 * len(fleet.records)
        assert all(0.0 < fleet.rates[i] < 1.0 for i in fleet.loop.last_ids)
        assert "reference_seconds" in record and (tmp_path / "reference_pass_rates.json").is_file()
    if name in ("dynamic_sampling", "greso"):  # only informative groups kept
        assert record["effective_ratio"] > 0 and all(0.0 < fleet.rates[i] < 1.0 for i in fleet.loop.last_ids)
    if name == "speed":  # screening of k*m with n_init, continuation of the accepted
        assert record["generation_rounds"] >= 2 and record["samples_generated"] >= 2 * M * 2 + M * (N - 2)
    if name == "probe":  # k*m candidates estimated with n_probe rollouts each, then m*n fresh ones
        assert record["generation_rounds"] == 2 and record["samples_generated"] == 2 * M * 8 + M * N


def test_the_probe_strategy_trains_on_fresh_rollouts_of_the_m_estimated_closest_to_target_p(tmp_path):
    """selection.type=probe through the loop: round 1 rolls out k*m candidates n_probe times each (indices from
    ESTIMATE_BASE), round 2 the m whose estimate is closest to target_p n times (indices 0..n-1); only round 2's
    samples reach the learner and the step record, the estimates never do."""
    from pcl.loop.rounds import ESTIMATE_BASE

    fleet = FakeFleet(tmp_path, config(STRATEGIES["probe"], run={"steps": 2}))
    fleet.run.run()
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "effective_ratio" in r]
    selections = read_metrics(tmp_path / "selections.jsonl")
    assert [r["step"] for r in records] == [s["step"] for s in selections] == [1, 2]
    assert [c["samples"] for c in fleet.rollouts.calls] == [2 * M * 8, M * N] * 2
    assert fleet.learner.trained == [(r["train_sequences"], M * N) for r in records] and not fleet.scorer.trained
    for step, (record, line) in enumerate(zip(records, selections)):
        estimating, training = fleet.rollouts.calls[2 * step: 2 * step + 2]
        assert estimating["version"] == training["version"] == step  # both rounds by this step's policy
        assert {s.n for s in estimating["sampling"]} == {8} and {s.n for s in training["sampling"]} == {N}
        estimates = {p: sum(fleet.rollouts.reward(p, ESTIMATE_BASE + i, step) for i in range(8)) / 8
                     for p in estimating["prompts"]}
        assert training["prompts"] == line["ids"] and closest_to(0.5, line["ids"], estimating["prompts"], estimates)
        assert record["probe_estimate_mean"] == pytest.approx(sum(estimates[p] for p in line["ids"]) / M)
        assert all(sorted(indices) == list(range(N)) for indices in line["samples"])  # fresh samples only
        trained = [fleet.rollouts.reward(p, i, step) for p in line["ids"] for i in range(N)]
        assert record["train_reward_mean"] == pytest.approx(sum(trained) / (M * N))
        assert record["batch_samples"] == record["batch_unique_samples"] == M * N and record["probe_target_p"] == 0.5


def test_each_generation_asks_for_the_sampling_it_means(tmp_path):
    """The batch and the reference pass sample with the rollout settings, the held-out evaluation at
    run.eval_temperature, the suite with `pcl eval`'s decoding (its response budget the rollout's when unset)."""
    cfg = config(STRATEGIES["prefilter"], run={"steps": 1, "eval_every": 1, "eval_samples": 2, "eval_temperature": 0.3},
                 rollout={"temperature": 0.9, "top_p": 0.8, "top_k": 5, "max_new_tokens": 77},
                 evaluation={"suite": ["math500"], "every": 1, "k": {"math500": 3}})
    fleet = FakeFleet(tmp_path, cfg, held_out=3, suite={"math500": world()[0][:2]})
    fleet.run.run()
    asked: dict[str, set] = {}
    for call in fleet.rollouts.calls:
        asked.setdefault(call["tag"], set()).update(call["sampling"])
    rollout = dict(temperature=0.9, top_p=0.8, top_k=5, max_new_tokens=77)
    assert asked == {"reference": {SamplingParams(n=4, **rollout)}, "": {SamplingParams(n=N, **rollout)},
                     "eval": {SamplingParams(n=2, **{**rollout, "temperature": 0.3})},
                     "suite": {SamplingParams(n=3, temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=77)}}


def test_the_probe_is_timed_apart_from_generation(tmp_path):
    """V's explained-variance probe rides in the batch's generation call; its share of the call's seconds (by
    sample count) is probe_seconds, so generation_seconds is the strategy's own generation."""
    fleet = FakeFleet(tmp_path, config(STRATEGIES["pcl"]))
    record = fleet.loop.train_step(0)
    assert fleet.rollouts.calls[0]["samples"] == record["samples_generated"] + record["probe_samples"]
    assert record["samples_generated"] == M * N and record["probe_samples"] % N == 0 and record["probe_samples"]
    assert record["generation_seconds"] == pytest.approx(M * N * SECONDS_PER_SAMPLE)
    assert record["probe_seconds"] == pytest.approx(record["probe_samples"] * SECONDS_PER_SAMPLE)


def test_the_probe_runs_every_ev_every_steps_only(tmp_path):
    """V's explained-variance probe is monitoring: on steps between probes a PCL step generates the batch alone
    (no probe samples, no probe seconds, no EV figure); on probe steps the figure covers the recent probes."""
    fleet = FakeFleet(tmp_path, config(STRATEGIES["pcl"], value={"ev_sample": 6, "ev_every": 3}, run={"steps": 7}))
    records = [fleet.loop.train_step(step) for step in range(7)]
    probed = [r["probe_samples"] > 0 for r in records]
    assert probed == [True, False, False, True, False, False, True]
    for record, due in zip(records, probed):
        assert (record["value_explained_variance"] is not None) == due
        assert 0.0 <= record["selected_value_mean"] <= 1.0  # V's predictions of the batch, probe or not
        assert record["samples_generated"] == M * N and (record["probe_seconds"] > 0) == due
        assert fleet.rollouts.calls[records.index(record)]["samples"] == M * N + record["probe_samples"]


@pytest.mark.parametrize("beside", [True, False])
def test_the_policys_own_step_is_timed_apart_from_vs(tmp_path, beside):
    """policy_train_seconds is the policy's step alone; train_seconds also holds V's step: beside the policy's (the
    default) it costs what it runs past the policy's end, after it (value.train_beside_policy: false) all of it."""
    cfg = config(STRATEGIES["pcl"], value={"ev_sample": 6, "train_beside_policy": beside})
    fleet = FakeFleet(tmp_path, cfg, learner_seconds=0.3, value_seconds=0.5)
    record = fleet.loop.train_step(0)
    assert record["policy_train_seconds"] == pytest.approx(0.3) and record["value_train_seconds"] == 0.5
    assert record["train_seconds"] == pytest.approx(0.5 if beside else 0.8)
    assert len(fleet.scorer.trained) == 1  # V trained once on the batch, either way
    uniform = FakeFleet(tmp_path / "uniform", config(STRATEGIES["uniform"]), learner_seconds=0.3, value_seconds=0.5)
    assert uniform.loop.train_step(0)["train_seconds"] == pytest.approx(0.3)  # no V: the policy's step alone


def test_pipelined_selection_scores_the_next_steps_candidates_during_this_step(tmp_path):
    fleet = FakeFleet(tmp_path, config({**STRATEGIES["pcl"], "pipelined": True}))
    first, second = fleet.loop.train_step(0), fleet.loop.train_step(1)
    assert first["prefetch_hits"] == 0 and second["prefetch_hits"] == 1
    assert fleet.loop.state.prefetched is not None  # step 3's pool, drawn during step 2


class LoopsViewOnly:
    """Uniform selection written against the loop's view of a strategy (`pcl.strategies.base.StepStrategy`) and
    nothing more: no base class, none of the strategy-specific hooks."""

    name, needs = "uniform", Needs()

    def __init__(self, m: int, n: int):
        self.m, self.n, self.batch, self.ready = m, n, [], False

    def load_reference(self, pass_rates) -> None:
        raise AssertionError("no reference rollouts were asked for")

    def start_step(self, step: int) -> list:
        self.batch, self.ready = [], False
        return []

    def next_request(self) -> Request:
        return Request(draw=self.m)

    def propose(self, candidates, values) -> list[Rollout]:
        self.batch = list(candidates[: self.m])
        return [Rollout(p, self.n) for p in self.batch]

    def observe(self, rewards) -> None:
        self.ready = True

    def end_step(self, samples_of) -> list:
        return self.batch

    def metrics(self) -> dict:
        return {"own_figure": 1.0}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_the_loop_drives_a_strategy_through_its_view_only(tmp_path):
    from pcl.loop import StepLoop

    fleet = FakeFleet(tmp_path, config(STRATEGIES["uniform"]))
    strategy = LoopsViewOnly(M, N)
    assert isinstance(strategy, StepStrategy) and isinstance(fleet.strategy, StepStrategy)
    loop = StepLoop(fleet.cfg, strategy, fleet.prompts, None, fleet.rollouts, fleet.learner, str(tmp_path), fleet.clock)
    record = loop.train_step(0)
    assert record.batch_samples == M * N and loop.last_ids == [p.id for p in strategy.batch]
    assert record.extra["own_figure"] == 1.0 and fleet.learner.synced == [1]


def test_a_step_duration_is_a_field_of_the_step_record():
    from pcl.loop.ports import SystemClock
    from pcl.loop.step import StepTimer

    timer = StepTimer(SystemClock())
    with timer("train_seconds"):
        pass
    assert set(timer) == {"train_seconds"}
    with pytest.raises(ValueError, match="train_secs is not a field of pcl.loop.record.StepRecord"):
        with timer("train_secs"):
            pass
