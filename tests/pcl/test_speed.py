"""SPEED (`pcl.strategies.speed`) through the round protocol against the simulated prompt world: screening then
continuation across rounds, the carried buffer across steps and checkpoints, and the settings it refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcl.config import SpeedSelection
from pcl.samples import Sample
from pcl.strategies import make_strategy
from pcl.strategies.speed import SpeedStrategy
from tests.pcl.strategy_world import World, rates_cycle


def test_speed_screens_then_continues_the_accepted_with_indices_across_rounds():
    rates = rates_cycle(400, [0.0, 0.5])
    world = World(rates)
    strategy = SpeedStrategy(8, 8, k=4, n_init=4, max_rounds=4)
    batch, groups, ledger, rounds = world.run_step(strategy)
    assert rounds == 2  # screening, then continuation of the accepted (32 screened, ~15 accepted)
    assert all(rates[p.id] == 0.5 for p in batch)
    for p in batch:  # screening responses 0..3 and continuation 4..7 form the group
        assert sorted(s.sample_index for s in ledger.samples[p.id]) == list(range(8))
    assert ledger.generated == 32 * 4 + 8 * 4  # screening of k*m, continuation of m
    m = strategy.metrics()
    assert m["speed_shortfall"] == 0 and m["speed_screened"] == 32 and 0 < m["speed_accept_share"] < 1


def test_speed_batches_continuation_with_the_next_screening():
    world = World(rates_cycle(400, [0.5]))
    strategy = SpeedStrategy(16, 10, k=1, n_init=4, max_rounds=6)
    strategy.begin_step(0)
    first = strategy.propose(world.draw(strategy.next_request().draw), None)
    assert len(first) == 16 and {r.n for r in first} == {4}
    # Half the screened prompts get mixed rewards (accepted), half all-wrong (rejected).
    strategy.observe({r.prompt.id: np.array([0.0, 1, 0, 0]) if i % 2 else np.zeros(4) for i, r in enumerate(first)})
    request = strategy.next_request()
    assert request.draw == 16  # 8 accepted < m: screen more in the same call
    second = strategy.propose(world.draw(request.draw), None)
    accepted = {r.prompt.id for i, r in enumerate(first) if i % 2}
    assert {r.prompt.id for r in second if r.n == 6} == accepted  # continuation: n - n_init = 6 each
    fresh = [r for r in second if r.n == 4]
    assert len(fresh) == 16 and not {r.prompt.id for r in fresh} & {r.prompt.id for r in first}


def test_speed_fills_from_screened_prompts_in_the_last_round_when_nothing_is_accepted():
    world = World(rates_cycle(400, [1.0]))
    strategy = SpeedStrategy(8, 6, k=2, n_init=2, max_rounds=3)
    batch, groups, _, rounds = world.run_step(strategy)
    assert rounds == 3 and groups.rewards.shape == (8, 6) and (groups.rewards == 1).all()
    assert strategy.metrics()["speed_shortfall"] == 8 and strategy.metrics()["speed_shortfall_total"] == 8


def test_speed_carry_over_continues_the_accepted_leftover_in_the_next_step_in_one_call():
    rates = rates_cycle(4000, [0.5])  # n_init=4 screening accepts ~7/8
    world = World(rates)
    strategy = make_strategy(SpeedSelection(), 8, seed=0, n=8)  # the config's default: the paper's SPEED
    assert (strategy.k, strategy.n_init, strategy.carry_over) == (2, 4, True)
    _, _, first, rounds = world.run_step(strategy, 0)
    m0 = strategy.metrics()
    assert rounds == 2 and m0["speed_carried_in"] == 0 and m0["speed_off_policy_prompts"] == 0
    carried = strategy.carry_ids
    assert len(carried) == m0["speed_carried_out"] > 0  # screened by step 0's policy, not continued
    assert {s.prompt_id for s in strategy.carried_samples()} == set(carried)
    assert all(s.sample_index < 4 for s in strategy.carried_samples())
    for step in range(1, 6):
        batch, groups, ledger, rounds = world.run_step(strategy, step)  # the harness checks indices 0..n-1
        m = strategy.metrics()
        assert rounds == 1  # continuation of D_accepted, batched with screening that refills it
        assert m["speed_off_policy_prompts"] == 8 and groups.rewards.shape == (8, 8)
        assert ledger.generated == 8 * 4 + m["speed_screened"] * 4  # carried samples are not generated again
        assert m["speed_carried_out"] >= 8  # a full next step in reserve, so the buffer stays bounded
        assert m["speed_carried_out"] <= 8 + 2 * 8


def test_speed_carried_buffer_and_samples_survive_a_checkpoint_exactly():
    rates = rates_cycle(400, [0.0, 0.5, 0.5, 1.0])
    a, b = World(rates), World(rates)
    first = SpeedStrategy(8, 8, k=2, n_init=4, max_rounds=4, carry_over=True)
    for step in range(3):
        a.run_step(first, step)
    state = json.loads(json.dumps(first.state_dict()))
    second = SpeedStrategy(8, 8, k=2, n_init=4, max_rounds=4, carry_over=True)
    second.load_state_dict(state)
    assert second.carry_ids == first.carry_ids and second.carried_samples() == first.carried_samples()
    assert second.buffer == first.buffer and second.totals == first.totals
    b.sampler.load_state_dict(a.sampler.state_dict())
    a.rng, b.rng = np.random.default_rng(7), np.random.default_rng(7)
    assert [p.id for p in a.run_step(first, 3)[0]] == [p.id for p in b.run_step(second, 3)[0]]
    assert first.carried_samples() == second.carried_samples()


def test_speed_carried_samples_keep_their_version_and_log_probs_through_a_checkpoint():
    """The carried screening samples of a resumed run still say which policy generated them (selections.jsonl's
    versions) and carry the engine's log-probs (the off-policy correction needs them)."""
    strategy = SpeedStrategy(8, 8, k=2, n_init=4, max_rounds=4, carry_over=True)
    strategy.buffer_samples = [Sample("p1", 2, (5, 6), (7, 8), 1.0, "stop", (-0.25, -1.5), 3)]
    resumed = SpeedStrategy(8, 8, k=2, n_init=4, max_rounds=4, carry_over=True)
    resumed.load_state_dict(json.loads(json.dumps(strategy.state_dict())))
    assert resumed.buffer_samples == strategy.buffer_samples


def test_speed_on_policy_drops_the_accepted_leftover_at_the_end_of_the_step():
    world = World(rates_cycle(400, [0.5]))
    strategy = make_strategy(SpeedSelection(carry_over=False), 8, n=8)
    for step in range(3):
        _, _, ledger, rounds = world.run_step(strategy, step)
        m = strategy.metrics()
        assert m["speed_carried_in"] == m["speed_carried_out"] == m["speed_off_policy_prompts"] == 0
        assert rounds == 2 and strategy.carried_samples() == [] and strategy.state_dict()["buffer"] == []


def test_speed_rejects_settings_that_cannot_work():
    with pytest.raises(ValueError, match="n_init .* below run.n"):
        SpeedStrategy(8, 4, k=2, n_init=4, max_rounds=3)
    with pytest.raises(ValueError, match="max_rounds"):
        SpeedStrategy(8, 8, k=2, n_init=4, max_rounds=1)


# -- greso -----------------------------------------------------------------------------------------------------
