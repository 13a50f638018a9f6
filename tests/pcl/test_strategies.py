"""The seven selection strategies, driven through the round protocol exactly as the coordinator drives them,
against simulated prompts with known pass rates (Bernoulli rewards): batch shape and sample indices, what
each keeps, bounded rounds with counted shortfalls, adaptation, and state round trips."""

from __future__ import annotations

import json
from typing import Annotated, Literal, Union, get_args

import numpy as np
import pytest
from pydantic import Field

from pcl.samples import Sample
from pcl.config import (DynamicSamplingSelection, GresoSelection, PCLSelection, PrefilterSelection, ProbeSelection,
                        Section, Selection, SpeedSelection, UniformSelection)
from pcl.data.prompts import PromptRecord
from pcl.engines import RolloutRequest, SamplingParams
from pcl.loop.rounds import ESTIMATE_BASE, RoundLedger
from pcl.strategies import STRATEGIES, check_strategy, make_strategy, strategy_class, strategy_registry
from pcl.strategies.base import Needs, Rollout
from pcl.strategies.dynamic_sampling import DynamicSamplingStrategy
from pcl.strategies.greso import GresoStrategy
from pcl.strategies.prefilter import PrefilterStrategy
from pcl.strategies.probe import ProbeStrategy
from pcl.strategies.prompt_curriculum import PCLStrategy
from pcl.strategies.speed import SpeedStrategy
from pcl.strategies.uniform import UniformStrategy
from pcl.data.fingerprint import data_fingerprint
from pcl.data.reference_rates import load_reference, pass_rates, save_reference
from tests.pcl.strategy_world import World, prompts, rates_cycle


# -- the ledger ------------------------------------------------------------------------------------------------


def test_ledger_continues_sample_indices_of_a_prompt_across_rounds():
    a, b = prompts(2)
    ledger, sampling = RoundLedger(), SamplingParams(n=16, temperature=0.7, max_new_tokens=64, seed=3)
    assert ledger.reserve([Rollout(a, 4), Rollout(b, 2)], sampling) == [
        RolloutRequest("p0", a.prompt_token_ids, SamplingParams(n=4, temperature=0.7, max_new_tokens=64, seed=3)),
        RolloutRequest("p1", b.prompt_token_ids, SamplingParams(n=2, temperature=0.7, max_new_tokens=64, seed=3))]
    [again] = ledger.reserve([Rollout(a, 12)], sampling)  # a second round never reuses indices 0..3
    assert again.indices == range(4, 16) and again.n == again.sampling.n == 12
    ledger.add([Sample("p0", 5, (), (), 1.0, "stop"), Sample("p0", 4, (), (), 0.0, "stop")])
    assert ledger.round_rewards(ledger.samples["p0"])["p0"].tolist() == [0.0, 1.0]  # sample-index order
    assert ledger.rounds == 1 and ledger.generated == 2


# -- uniform and pcl -------------------------------------------------------------------------------------------


def test_uniform_trains_on_the_next_m_prompts_of_the_stream():
    world = World(rates_cycle(64, [0.5]))
    expected = [p.id for p in World(rates_cycle(64, [0.5])).draw(8)]
    batch, groups, ledger, rounds = world.run_step(UniformStrategy(8, 4))
    assert [p.id for p in batch] == expected and groups.rewards.shape == (8, 4) and rounds == 1
    assert ledger.generated == 32


def test_pcl_picks_the_m_closest_to_tau_and_takes_new_tau_and_k_next_step():
    world, twin = World(rates_cycle(64, [0.5])), World(rates_cycle(64, [0.5]))
    values = {f"p{i}": (i % 10) / 10 for i in range(64)}

    def closest(candidates, m, tau):  # by distance to tau, ties to the earlier candidate
        order = sorted(range(len(candidates)), key=lambda i: (abs(values[candidates[i].id] - tau), i))
        return [candidates[i].id for i in order[:m]]

    strategy = PCLStrategy(4, 2, tau=0.5, k=4)
    batch, _, _, _ = world.run_step(strategy, values=values)
    assert [p.id for p in batch] == closest(twin.draw(16), 4, 0.5) and strategy.next_request().draw == 16
    assert strategy.tune(tau=0.2, k=2) == {"tau": (0.5, 0.2), "k": (4, 2)}  # what the control plane does
    batch, _, _, _ = world.run_step(strategy, 1, values=values)
    assert [p.id for p in batch] == closest(twin.draw(8), 4, 0.2) and strategy.next_request().draw == 8
    other = PCLStrategy(4, 2, tau=0.5, k=4)
    other.load_state_dict(json.loads(json.dumps(strategy.state_dict())))
    assert (other.tau, other.k) == (0.2, 2) and strategy.metrics() == {"tau": 0.2, "k": 2.0}


def test_pcl_without_values_is_an_error():
    strategy = PCLStrategy(2, 2, 0.5, 2)
    strategy.begin_step(0)
    with pytest.raises(ValueError, match="value model"):
        strategy.propose(prompts(4), None)


# -- prefilter -------------------------------------------------------------------------------------------------


def test_prefilter_trains_only_on_prompts_inside_the_reference_interval():
    rates = rates_cycle(200, [0.0, 0.1, 0.5, 0.9, 1.0])
    world = World(rates)
    strategy = PrefilterStrategy(16, 4, n_pre=8, p_low=0.05, p_high=0.95)
    strategy.load_reference(rates)
    assert strategy.metrics()["prefilter_admitted_share"] == pytest.approx(0.6)
    for step in range(5):
        batch, _, ledger, _ = world.run_step(strategy, step)
        assert all(0.05 < rates[p.id] < 0.95 for p in batch)
        assert ledger.generated == 16 * 4  # only the batch is generated: the filter costs no rollouts


def test_prefilter_needs_reference_rates_and_enough_admitted_prompts():
    strategy = PrefilterStrategy(8, 4, n_pre=8, p_low=0.0, p_high=1.0)
    with pytest.raises(RuntimeError, match="load_reference"):
        strategy.begin_step(0)
    with pytest.raises(ValueError, match="only 5 of 20 .* fewer than run.m=8"):
        strategy.load_reference(rates_cycle(20, [0.0, 0.0, 1.0, 0.5]))


# -- dynamic sampling ------------------------------------------------------------------------------------------


def test_dynamic_sampling_keeps_only_informative_prompts_when_there_are_enough():
    rates = rates_cycle(400, [0.0, 1.0, 0.5])
    world = World(rates)
    strategy = DynamicSamplingStrategy(16, 8, k=1, max_rounds=10)
    batch, groups, _, rounds = world.run_step(strategy)
    assert all(rates[p.id] == 0.5 for p in batch) and rounds >= 2  # a third informative: several rounds
    assert (groups.rewards.std(axis=1) > 0).all()
    assert strategy.metrics()["dynamic_sampling_shortfall"] == 0


def test_dynamic_sampling_fill_pads_the_batch_and_counts_the_shortfall_when_rounds_run_out():
    world = World(rates_cycle(400, [0.0, 1.0]))  # nothing informative at all
    strategy = DynamicSamplingStrategy(16, 4, k=2, max_rounds=3, at_round_limit="fill")
    batch, groups, ledger, rounds = world.run_step(strategy)
    assert rounds == 3 and ledger.generated == 3 * 32 * 4  # bounded: exactly max_rounds rounds
    assert groups.rewards.shape == (16, 4)  # filled with the best available, never a crash
    assert strategy.metrics()["dynamic_sampling_shortfall"] == 16
    world.run_step(strategy, 1)
    m = strategy.metrics()
    assert m["dynamic_sampling_shortfall_total"] == 32 and m["dynamic_sampling_round_limit_hits_total"] == 2


def test_dynamic_sampling_as_the_paper_draws_2m_per_round_until_m_informative_prompts_are_buffered():
    rates = rates_cycle(2000, [0.0, 1.0, 0.0, 1.0, 0.0, 0.5])  # a sixth informative: about 3 rounds of 2m
    world = World(rates)
    strategy = make_strategy(DynamicSamplingSelection(), 16, n=8)
    assert (strategy.k, strategy.max_rounds, strategy.at_round_limit) == (2, 16, "shrink")
    strategy.begin_step(0)
    assert strategy.next_request().draw == 32  # k*m
    batch, groups, ledger, rounds = world.run_step(strategy)
    assert rounds >= 2 and ledger.generated == rounds * 32 * 8
    assert all(rates[p.id] == 0.5 for p in batch) and (groups.rewards.std(axis=1) > 0).all()  # effective ratio 1
    m = strategy.metrics()
    assert m["dynamic_sampling_round_limit_hit"] == 0 and m["dynamic_sampling_round_limit_hits_total"] == 0


def test_dynamic_sampling_shrink_trains_on_the_informative_prompts_kept_when_the_round_limit_hits(caplog):
    rates = rates_cycle(2000, [0.0] * 15 + [0.5])  # 1 in 16 informative: 2 rounds of 2m keep about 4 of m=16
    world = World(rates)
    strategy = DynamicSamplingStrategy(16, 8, k=2, max_rounds=2, at_round_limit="shrink")
    with caplog.at_level("WARNING", logger="pcl.strategies.base"):
        batch, groups, _, rounds = world.run_step(strategy, full=False)
    assert rounds == 2 and 1 <= len(batch) < 16
    assert all(rates[p.id] == 0.5 for p in batch) and (groups.rewards.std(axis=1) > 0).all()
    m = strategy.metrics()
    assert m["dynamic_sampling_batch_prompts"] == len(batch) and m["dynamic_sampling_filled"] == 0
    assert m["dynamic_sampling_shortfall"] == 16 - len(batch) and m["dynamic_sampling_round_limit_hits_total"] == 1
    assert "max_rounds=2" in caplog.text and f"trains on those {len(batch)} prompts only" in caplog.text
    state = json.loads(json.dumps(strategy.state_dict()))
    again = DynamicSamplingStrategy(16, 8, k=2, max_rounds=2, at_round_limit="shrink")
    again.load_state_dict(state)
    assert again.totals == strategy.totals and again.totals["round_limit_hits"] == 1


def test_dynamic_sampling_shrink_with_nothing_informative_trains_a_zero_gradient_batch_of_m():
    world = World(rates_cycle(400, [0.0, 1.0]))
    strategy = DynamicSamplingStrategy(8, 4, k=2, max_rounds=2, at_round_limit="shrink")
    _, groups, _, _ = world.run_step(strategy)
    assert groups.rewards.shape == (8, 4) and (groups.rewards.std(axis=1) == 0).all()
    assert strategy.metrics()["dynamic_sampling_filled"] == 8
    assert strategy.metrics()["dynamic_sampling_round_limit_hits_total"] == 1
    with pytest.raises(ValueError, match="at_round_limit"):
        DynamicSamplingStrategy(8, 4, k=2, max_rounds=2, at_round_limit="crash")


# -- speed -----------------------------------------------------------------------------------------------------


def greso(**kw) -> GresoStrategy:
    args = dict(m=16, n=4, k=1, max_rounds=4, p_easy=0.5, p_hard=0.5, delta_p=0.01, target_zero_variance=0.25)
    return GresoStrategy(**(args | kw))


def test_greso_keep_probability_follows_the_streak():
    strategy = greso()
    strategy.streaks = {"easy3": 3, "hard2": -2}
    assert strategy.keep_probability("new") == 1.0
    assert strategy.keep_probability("easy3") == pytest.approx(0.125)
    assert strategy.keep_probability("hard2") == pytest.approx(0.25)
    strategy.streaks["easy30"] = 30
    assert strategy.keep_probability("easy30") == 0.01  # never below the floor


def test_greso_skips_prompts_that_keep_being_all_correct_and_adapts_p_easy():
    rates = rates_cycle(64, [1.0, 1.0, 0.5])  # two thirds always solved: far above the easy target
    world = World(rates)
    strategy = greso(m=8)
    skipped = 0
    for step in range(40):  # ~5 epochs of the 64 prompts
        batch, _, _, _ = world.run_step(strategy, step)
        skipped += strategy.metrics()["greso_skipped"]
    assert skipped > 0
    assert strategy.p_easy < 0.5 - 0.1  # lowered step by step: more easy prompts skipped
    assert strategy.streaks and all(v > 0 for k, v in strategy.streaks.items() if rates[k] == 1.0)


def test_greso_state_round_trip_reproduces_its_decisions():
    rates = rates_cycle(64, [1.0, 0.0, 0.5])
    a, b = World(rates), World(rates)
    first = greso(m=8)
    for step in range(10):
        a.run_step(first, step)
    second = greso(m=8, seed=99)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert (second.p_easy, second.p_hard, second.streaks) == (first.p_easy, first.p_hard, first.streaks)
    b.sampler.load_state_dict(a.sampler.state_dict())  # the same prompt stream and rewards from here on
    a.rng, b.rng = np.random.default_rng(123), np.random.default_rng(123)
    assert [p.id for p in a.run_step(first, 10)[0]] == [p.id for p in b.run_step(second, 10)[0]]


def test_greso_last_round_skips_nothing_so_the_batch_fills():
    world = World(rates_cycle(64, [1.0]))
    strategy = greso(m=8, max_rounds=2)
    strategy.streaks = {f"p{i}": 50 for i in range(64)}  # everything would be skipped at the floor
    batch, groups, _, rounds = world.run_step(strategy)
    assert rounds == 2 and groups.rewards.shape == (8, 4)
    assert strategy.metrics()["greso_shortfall"] == 8


# -- construction from the config ------------------------------------------------------------------------------


def test_make_strategy_builds_every_configured_type():
    kinds = [(UniformSelection(), UniformStrategy), (PCLSelection(), PCLStrategy),
             (PrefilterSelection(), PrefilterStrategy), (DynamicSamplingSelection(), DynamicSamplingStrategy),
             (SpeedSelection(), SpeedStrategy), (GresoSelection(), GresoStrategy)]
    for section, cls in kinds:
        strategy = make_strategy(section, 8, 0, n=8)
        assert type(strategy) is cls and strategy.name == section.type
    assert make_strategy(PCLSelection(pipelined=True), 8, n=8).needs == Needs(values=True, prefetch=32)
    assert make_strategy(PCLSelection(), 8, n=8).needs == Needs(values=True)
    assert make_strategy(PrefilterSelection(n_pre=6), 8, n=8).needs == Needs(reference_rollouts=6)
    assert make_strategy(PrefilterSelection(), 8, n=8).needs.reference_rollouts == 16  # the paper's n_pre
    assert make_strategy(UniformSelection(), 8, n=8).needs == Needs()
    speed = make_strategy(SpeedSelection(), 8, n=16)
    assert (speed.k, speed.n_init) == (2, 4)
    greso_first = make_strategy(GresoSelection(), 512, n=16)
    greso_first.begin_step(0)
    assert greso_first.next_request().draw == 768  # the paper's B_r^default for m = 512
    with pytest.raises(ValueError, match="n_init"):
        make_strategy(SpeedSelection(n_init=8), 8, n=8)
    assert type(make_strategy(ProbeSelection(target_p=0.25), 8, n=8)) is ProbeStrategy


# -- the registry and tune -------------------------------------------------------------------------------------


def test_every_selection_type_is_registered_with_capabilities_readable_from_the_class():
    assert set(STRATEGIES) == {"uniform", "pcl", "prefilter", "dynamic_sampling", "speed", "greso", "probe"}
    assert [name for name, cls in STRATEGIES.items() if cls.needs_values] == ["pcl"]
    assert [name for name, cls in STRATEGIES.items() if cls.uses_reference] == ["prefilter"]
    assert strategy_class(PCLSelection()) is PCLStrategy and strategy_class("probe") is ProbeStrategy
    assert set(PCLStrategy.tunable) == {"tau", "k"} and not UniformStrategy.tunable
    with pytest.raises(ValueError, match="'nope' is not a known strategy"):
        strategy_class("nope")
    with pytest.raises(ValueError, match="n_init"):  # checked without building one
        check_strategy(SpeedSelection(n_init=8), 8, n=8)
    assert check_strategy(SpeedSelection(n_init=4), 8, n=8) is SpeedStrategy


def test_the_registry_is_derived_from_the_selection_union():
    """A strategy is its file (a class whose `config` is its section) and its section in the config's union;
    its name is the section's `type`."""
    sections = get_args(get_args(Selection)[0])
    assert list(STRATEGIES) == [s.model_fields["type"].default for s in sections]
    assert all(cls.config is s and cls.name == s.model_fields["type"].default
               for s, cls in zip(sections, STRATEGIES.values()))

    class OrphanSelection(Section):
        type: Literal["orphan"] = "orphan"

    with pytest.raises(TypeError, match="OrphanSelection.*no strategy class"):
        strategy_registry(Annotated[Union[UniformSelection, OrphanSelection], Field(discriminator="type")])
    with pytest.raises(TypeError, match="Strategy's config .*Selection is not in the selection union"):
        strategy_registry(Annotated[Union[UniformSelection, SpeedSelection], Field(discriminator="type")])


def test_tune_validates_every_change_before_applying_any_and_returns_what_changed():
    strategy = PCLStrategy(8, 4, tau=0.5, k=4)
    assert strategy.tune(tau=0.5) == {}  # nothing changed
    with pytest.raises(ValueError, match=r"selection.tau: 1.5 is outside \[0.0, 1.0\]"):
        strategy.tune(k=2, tau=1.5)
    with pytest.raises(ValueError, match=r"cannot tune 'n_probe' \(it can tune: k, tau\)"):
        strategy.tune(k=2, n_probe=3)
    with pytest.raises(ValueError, match="selection.k: expected a whole number, got 2.5"):
        strategy.tune(k=2.5)
    with pytest.raises(ValueError, match="selection.tau: expected a number, got 'x'"):
        strategy.tune(tau="x")
    assert (strategy.tau, strategy.k) == (0.5, 4)  # a refused call applies nothing
    assert strategy.tune(k=2.0) == {"k": (4, 2)} and type(strategy.k) is int
    with pytest.raises(ValueError, match="'uniform' cannot tune 'tau' \\(it can tune: nothing\\)"):
        UniformStrategy(8, 4).tune(tau=0.3)


# -- probe (the paper's difficulty experiment) -------------------------------------------------------------------


def test_probe_trains_on_the_m_estimated_closest_to_target_p_with_fresh_rollouts_only():
    rates = rates_cycle(400, [0.0, 0.5, 1.0])
    world = World(rates)
    strategy = ProbeStrategy(8, 4, target_p=0.5, k=4, n_probe=16)
    batch, groups, ledger, rounds = world.run_step(strategy)
    assert rounds == 2 and world.generated == 32 * 16 + 8 * 4  # k*m*n_probe estimates, then m*n trained
    assert ledger.estimated == 32 * 16 and ledger.generated == 32 * 16 + 8 * 4
    assert all(rates[p.id] == 0.5 for p in batch)  # 16 estimates tell 0.5 from 0 and 1 apart
    assert all(s.sample_index < 4 for p in batch for s in ledger.samples_of([p.id]))  # estimates not reused
    assert groups.rewards.shape == (8, 4)
    easy = ProbeStrategy(8, 4, target_p=1.0, k=8, n_probe=16)  # about 21 of 64 candidates always solved
    batch, groups, _, _ = World(rates, seed=1).run_step(easy)
    assert all(rates[p.id] == 1.0 for p in batch) and groups.rewards.min() == 1.0  # all solved: no gradient
    metrics = easy.metrics()
    assert metrics["probe_target_p"] == 1.0 and metrics["probe_estimate_mean"] == 1.0


def test_probe_state_round_trips_and_target_p_is_tunable():
    strategy = ProbeStrategy(4, 2, target_p=0.25, k=2, n_probe=4)
    assert strategy.tune(target_p=0.75) == {"target_p": (0.25, 0.75)}
    other = ProbeStrategy(4, 2, target_p=0.5, k=4, n_probe=4)
    other.load_state_dict(json.loads(json.dumps(strategy.state_dict())))
    assert (other.target_p, other.k) == (0.75, 2)
    with pytest.raises(ValueError, match="target_p"):
        ProbeStrategy(4, 2, target_p=1.5, k=2, n_probe=4)
    strategy.begin_step(0)
    assert strategy.next_request().draw == 8 and not strategy.ready
    rollouts = strategy.propose(prompts(8), None)
    assert len(rollouts) == 8 and not any(r.train for r in rollouts) and {r.n for r in rollouts} == {4}
    with pytest.raises(ValueError, match="no estimation rewards"):
        strategy.observe({})


def test_ledger_keeps_estimation_rollouts_apart_from_the_trained_samples():
    a, = prompts(1)
    ledger = RoundLedger()
    indices = lambda requests: [r.indices for r in requests]  # noqa: E731
    assert indices(ledger.reserve([Rollout(a, 4, train=False)], SamplingParams())) == [range(ESTIMATE_BASE,
                                                                                            ESTIMATE_BASE + 4)]
    assert indices(ledger.reserve([Rollout(a, 2), Rollout(a, 2, train=False)], SamplingParams())) == [
        range(0, 2), range(ESTIMATE_BASE + 4, ESTIMATE_BASE + 6)]
    ledger.add([Sample("p0", ESTIMATE_BASE, (), (), 1.0, "stop"), Sample("p0", 0, (), (), 0.0, "stop")])
    assert [s.sample_index for s in ledger.samples_of(["p0"])] == [0] and ledger.estimated == 1
    assert ledger.generated == 2


# -- reference pass rates --------------------------------------------------------------------------------------


def test_reference_cache_is_keyed_by_policy_prompts_and_n_pre(tmp_path):
    records = prompts(5)
    samples = [Sample(p.id, j, (), (), float(j < i), "stop") for i, p in enumerate(records) for j in range(4)]
    rates = pass_rates(samples)
    assert rates == {"p0": 0.0, "p1": 0.25, "p2": 0.5, "p3": 0.75, "p4": 1.0}
    path = tmp_path / "reference.json"
    save_reference(path, "tiny", records, 4, rates)
    assert load_reference(path, "tiny", records, 4) == rates
    assert load_reference(path, "tiny", list(reversed(records))) == rates  # any n_pre, any order
    assert load_reference(path, "other-policy", records, 4) is None
    assert load_reference(path, "tiny", records, 8) is None
    changed = records[:4] + [PromptRecord("p4", "9+9", "18", "9+9=", (1,))]
    assert data_fingerprint(changed) != data_fingerprint(records) and load_reference(path, "tiny", changed) is None
    assert load_reference(tmp_path / "absent.json", "tiny", records) is None
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a reference pass-rate cache"):
        load_reference(path, "tiny", records)
    with pytest.raises(ValueError, match="missing for 1 prompts"):
        save_reference(path, "tiny", records, 4, {k: v for k, v in rates.items() if k != "p2"})
