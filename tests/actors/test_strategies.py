"""Every rollout-based selection strategy, and pipelined PCL, for a few steps on real parts: local Ray actors,
an embedded Redis server, the HF engine, math-verify and the learner, on the warm-started tiny model (built
by `pcl make-tiny`, cached; built here on first use), on the session's Ray (tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from pcl.config import load_config
from pcl.loop.runlog import STEP_KEYS, read_metrics
from pcl.data.reference_rates import REFERENCE_FILE

pytestmark = [pytest.mark.ray, pytest.mark.redis]

M, N = 8, 4
STRATEGIES = {
    "prefilter": ["selection.type=prefilter", "selection.n_pre=4", "selection.p_low=0.05", "selection.p_high=0.95"],
    "dynamic_sampling": ["selection.type=dynamic_sampling", "selection.k=2", "selection.max_rounds=3"],
    "speed": ["selection.type=speed", "selection.k=2", "selection.n_init=2", "selection.max_rounds=3"],
    "speed_on_policy": ["selection.type=speed", "selection.k=2", "selection.n_init=2", "selection.max_rounds=3",
                        "selection.carry_over=false"],
    "greso": ["selection.type=greso", "selection.k=2", "selection.max_rounds=3"],
    "pcl_pipelined": ["selection.type=pcl", "selection.k=2", "selection.pipelined=true"],
    "probe": ["selection.type=probe", "selection.k=2", "selection.n_probe=2", "selection.target_p=0.5"],
}
# Each strategy's own figures in the step record.
OWN_METRICS = {"prefilter": "prefilter_admitted_share", "dynamic_sampling": "dynamic_sampling_shortfall",
               "speed": "speed_screened", "speed_on_policy": "speed_screened", "greso": "greso_p_easy",
               "pcl_pipelined": "tau", "probe": "probe_estimate_mean"}


# In the default suite: the multi-round and the pipelined paths (PCL runs in tests/actors/test_pipeline.py, uniform and
# PCL in tests/actors/test_local_parity.py);
# the others in `make test-slow` (every strategy's step also runs on the loop's in-memory ports: tests/pcl/loop).
DEFAULT_SUITE = {"dynamic_sampling", "pcl_pipelined"}


@pytest.mark.parametrize("name", [name if name in DEFAULT_SUITE else pytest.param(name, marks=pytest.mark.slow)
                                  for name in STRATEGIES])
def test_strategy_trains_a_few_steps_end_to_end(name, tiny_model, ray_session, tmp_path):
    from entrypoints.train import run_training

    cfg = load_config("configs/tiny.yaml", [
        "run.steps=3", f"run.m={M}", f"run.n={N}", "run.eval_every=0", "run.time_budget_s=null",
        "data.tiny_size=256", "value.ev_sample=4", "learner.num_ranks=1", "control.enabled=false",
        *STRATEGIES[name]])
    run = tmp_path / "run"
    assert run_training(cfg, run_dir=str(run)) == 0

    steps = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert set(STEP_KEYS) <= r.keys(), set(STEP_KEYS) - r.keys()
        assert r["dropped_stale_version"] == 0 and r["dead_letters"] == 0  # every round on-policy, none lost
        assert r["samples_generated"] >= M * N and 0.0 <= r["effective_ratio"] <= 1.0
        assert OWN_METRICS[name] in r
    assert [r["policy_version"] for r in steps] == [1, 2, 3]
    if name == "speed_on_policy":  # screening, then continuation (batched with more screening when short)
        assert all(r["generation_rounds"] >= 2 for r in steps)
        assert all(r["samples_generated"] >= 2 * M * 2 + M * (N - 2) for r in steps)
        assert all(r["speed_off_policy_prompts"] == 0 and r["speed_carried_out"] == 0 for r in steps)
    if name == "speed":  # the paper's SPEED: step 1 screens and continues; later steps continue D_accepted
        assert steps[0]["generation_rounds"] >= 2 and steps[0]["speed_off_policy_prompts"] == 0
        assert all(r["batch_unique_samples"] == r["batch_samples"] == M * N for r in steps)
        for before, r in zip(steps, steps[1:]):
            assert r["speed_carried_in"] == before["speed_carried_out"]
            assert r["speed_off_policy_prompts"] == min(M, r["speed_carried_in"])
        assert any(r["speed_off_policy_prompts"] > 0 for r in steps[1:])
    if name in ("dynamic_sampling", "greso"):
        assert all(1 <= r["generation_rounds"] <= 3 for r in steps)
        # The kept prompts have mixed rewards; only the counted shortfall may be zero-variance.
        assert all(r["effective_ratio"] > 0 or r[f"{name}_shortfall"] == M for r in steps)
    if name == "dynamic_sampling":  # at_round_limit=shrink: only informative groups, unless none was found
        assert all(r["effective_ratio"] == 1.0 or r["dynamic_sampling_filled"] == M for r in steps)
        assert all(r["batch_samples"] == r["dynamic_sampling_batch_prompts"] * N for r in steps)
        hits = [r["dynamic_sampling_round_limit_hit"] for r in steps]
        assert steps[-1]["dynamic_sampling_round_limit_hits_total"] == sum(hits)
    if name == "prefilter":
        cache = json.loads((run / REFERENCE_FILE).read_text())
        assert cache["n_pre"] == 4 and len(cache["pass_rates"]) == 256
        assert steps[0]["reference_seconds"] > 0 and "reference_seconds" not in steps[1]
        assert all(0.05 < r["selected_reference_pass_rate_mean"] < 0.95 for r in steps)
    if name == "probe":  # k*m candidates estimated with n_probe rollouts each, then m*n fresh ones trained on
        assert all(r["generation_rounds"] == 2 and r["samples_generated"] == 2 * M * 2 + M * N for r in steps)
        assert all(r["batch_samples"] == M * N and r["probe_target_p"] == 0.5 for r in steps)
    if name == "pcl_pipelined":  # steps 2 and 3 used candidates drawn and scored during the step before
        assert [r["prefetch_hits"] for r in steps] == [0, 1, 2]
        assert all(0.0 <= r["selected_value_mean"] <= 1.0 for r in steps)
