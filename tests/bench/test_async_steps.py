"""bench/async_steps.py's figures from metrics lines written here (no training): PCL's overhead over uniform GRPO is
the median over steps 3 on of step_seconds - policy_train_seconds, PCL's over uniform's, so V's step, V's scoring and
the probe count against PCL; V's share of the policy's step; every arm of the experiment is a valid config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench import async_steps

EXPERIMENT = yaml.safe_load(async_steps.EXPERIMENT.read_text())


def step_line(step: int, policy: float, value: float = 0.0, generation: float = 4.0, selection: float = 0.1,
              probe: float = 0.0, sync: float = 0.4, beside: bool = True) -> dict:
    """A synchronous step's line as the loop writes it: V's step beside the policy's costs what runs past it."""
    train = (max(policy, value) if beside else policy + value)
    line = {"step": step, "effective_ratio": 0.5, "selection_seconds": selection, "generation_seconds": generation,
            "probe_seconds": probe, "train_seconds": train, "policy_train_seconds": policy,
            "weight_sync_seconds": sync, "step_seconds": selection + generation + probe + train + sync,
            "batch_staleness": 0, "train_elapsed_seconds": 10.0 * step}
    return line | ({"value_train_seconds": value} if value else {})


def run_of(steps: int, **kwargs) -> list[dict]:
    return [step_line(s, **kwargs) for s in range(1, steps + 1)]


def old_overhead(pcl: list[dict], uniform: list[dict]) -> float:
    """The figure this bench printed before policy_train_seconds: PCL's step with uniform's training in place of
    PCL's (train_seconds, V's step inside it)."""
    import statistics

    outside = statistics.median(r["step_seconds"] - r["train_seconds"] for r in pcl)
    return (outside + statistics.median(r["train_seconds"] for r in uniform)) / statistics.median(
        r["step_seconds"] for r in uniform)


def test_the_overhead_is_the_ratio_of_the_medians_of_a_step_besides_the_policys_step():
    # PCL: selection 0.3 (V's scoring), generation 4.0, the probe 0.2, its policy step 2.0 with V's 1.0 beside it,
    # sync 0.4: step 6.9, besides the policy's step 4.9. Uniform: 0.1 + 4.0 + policy 1.0 + 0.4 = 5.5, besides 4.5.
    pcl = run_of(6, policy=2.0, value=1.0, selection=0.3, probe=0.2)
    uniform = run_of(6, policy=1.0)
    figures = async_steps.overhead(pcl, uniform)
    assert figures["pcl_outside"] == pytest.approx(4.9) and figures["uniform_outside"] == pytest.approx(4.5)
    assert figures["ratio"] == pytest.approx(4.9 / 4.5)
    assert figures["pcl_step"] == pytest.approx(6.9) and figures["uniform_step"] == pytest.approx(5.5)
    assert figures["pcl_policy"] == 2.0 and figures["uniform_policy"] == 1.0 and figures["value_step"] == 1.0


def test_a_slower_v_step_is_a_larger_overhead():
    """V's step beside the policy's: when it runs 1 s past the policy's end, the step is 1 s longer, and that second
    is PCL's. The figure printed before (uniform's train_seconds in place of PCL's) did not move."""
    uniform = run_of(6, policy=1.0)
    fast, slow = run_of(6, policy=2.0, value=1.0), run_of(6, policy=2.0, value=3.0)
    assert old_overhead(slow, uniform) == pytest.approx(old_overhead(fast, uniform))  # V's cost removed
    assert async_steps.overhead(fast, uniform)["ratio"] == pytest.approx(4.5 / 4.5)
    assert async_steps.overhead(slow, uniform)["ratio"] == pytest.approx(5.5 / 4.5)
    after = run_of(6, policy=2.0, value=1.0, beside=False)  # V's step after the policy's: all of it is PCL's
    assert async_steps.overhead(after, uniform)["ratio"] == pytest.approx(5.5 / 4.5)


def test_the_first_two_steps_are_left_out_and_one_slow_step_does_not_move_the_median():
    pcl = [step_line(1, policy=2.0, generation=60.0), step_line(2, policy=2.0, generation=30.0)]
    pcl += run_of(7, policy=2.0)[2:] + [step_line(8, policy=2.0, generation=40.0)]
    timed = async_steps.timed(pcl)
    assert [r["step"] for r in timed] == [3, 4, 5, 6, 7, 8]
    assert async_steps.overhead(timed, async_steps.timed(run_of(8, policy=1.0)))["ratio"] == pytest.approx(1.0)


def test_runs_recorded_before_the_policy_step_was_timed_give_no_overhead():
    old = [{k: v for k, v in line.items() if k != "policy_train_seconds"} for line in run_of(4, policy=1.0)]
    assert async_steps.overhead(old, run_of(4, policy=1.0)) is None


def test_where_the_time_besides_the_policy_step_goes_adds_up():
    lines = run_of(4, policy=2.0, value=2.5, selection=0.3, probe=0.2)
    parts = async_steps.outside_parts(lines)
    assert parts["V past the policy step"] == pytest.approx(0.5) and parts["probe"] == pytest.approx(0.2)
    assert parts["other"] == pytest.approx(0.0, abs=1e-12)
    assert sum(parts.values()) == pytest.approx(lines[0]["step_seconds"] - lines[0]["policy_train_seconds"])
    ahead = {**lines[0], "batch_staleness": 1, "learner_wait_seconds": 0.7}  # generated beside the previous step
    parts = async_steps.outside_parts([ahead])
    assert parts["generation"] == 0.7 and parts["probe"] == 0.0
    assert sum(parts.values()) == pytest.approx(ahead["step_seconds"] - ahead["policy_train_seconds"])


def write_run(runs_dir: Path, arm: str, seed: int, lines: list[dict]) -> None:
    (runs_dir / f"{arm}-seed{seed}").mkdir(parents=True)
    (runs_dir / f"{arm}-seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_the_report_prints_the_overhead_its_parts_and_vs_share(tmp_path, capsys):
    for seed in (0, 1):
        write_run(tmp_path, "pcl-shipped", seed, run_of(6, policy=2.4, value=1.0, selection=0.3))
        write_run(tmp_path, "uniform-shipped", seed, run_of(6, policy=1.0))
        write_run(tmp_path, "pcl-shipped-v-after", seed, run_of(6, policy=2.0, value=1.0, beside=False,
                                                                   selection=0.3))
    figures = async_steps.main(["--report-only", "--runs-dir", str(tmp_path), "--seeds", "0", "1", "--arms",
                                "pcl-shipped", "uniform-shipped", "pcl-shipped-v-after"])
    out = capsys.readouterr().out
    # besides the policy's step: PCL 0.3 + 4.0 + 0.4 = 4.7 s against uniform's 0.1 + 4.0 + 0.4 = 4.5 s
    assert figures["ratios"]["pcl overhead (shipped config, synchronous)"] == pytest.approx(4.7 / 4.5)
    assert (f"PCL's overhead (shipped config, synchronous): x{4.7 / 4.5:.3f}, median step_seconds - "
            "policy_train_seconds from step 3 on 4.70 s over uniform's 4.50 s (8 and 8 steps;") in out
    assert "the goal, <= 1.05: met" in out
    assert "besides the policy step, mean s (PCL / uniform): selection 0.30 / 0.10, generation 4.00 / 4.00" in out
    assert figures["ratios"]["policy step, V beside / V after (shipped)"] == pytest.approx(1.2)
    assert ("the policy's median step 2.40 s, 2.00 s with V's step after it (pcl-shipped-v-after): x1.200; V's own "
            "median step 1.00 s") in out


def test_an_overhead_above_the_goal_is_said_to_miss_it(tmp_path, capsys):
    write_run(tmp_path, "pcl-shipped", 0, run_of(6, policy=2.0, value=3.0))
    write_run(tmp_path, "uniform-shipped", 0, run_of(6, policy=1.0))
    async_steps.main(["--report-only", "--runs-dir", str(tmp_path), "--seeds", "0", "--arms", "pcl-shipped",
                      "uniform-shipped"])
    out = capsys.readouterr().out
    assert f"x{5.5 / 4.5:.3f}" in out and "the goal, <= 1.05: NOT met" in out
    assert "V past the policy step 1.00 / 0.00" in out  # where the time goes


@pytest.mark.parametrize("arm", list(EXPERIMENT["strategies"]))
def test_every_arm_of_the_experiment_is_a_valid_config(arm):
    from pcl.config import load_config

    base = async_steps.ROOT / EXPERIMENT["base"]
    cfg = load_config(base, EXPERIMENT["overrides"] + EXPERIMENT["strategies"][arm])
    if arm == "pcl-shipped-v-after":
        assert cfg.value.train_beside_policy is False and cfg.selection.type == "pcl"
    for pcl, uniform, _ in async_steps.OVERHEAD_PAIRS:
        assert pcl in EXPERIMENT["strategies"] and uniform in EXPERIMENT["strategies"]


def test_runs_without_a_third_step_give_no_overhead_and_say_so(tmp_path, capsys):
    """The first steps are not compared (start-up; one step ahead, the first generates its own batch too), even
    when a run has no others."""
    write_run(tmp_path, "pcl-async", 0, run_of(2, policy=2.0, value=1.0))
    write_run(tmp_path, "uniform-async", 0, run_of(2, policy=1.0))
    figures = async_steps.main(["--report-only", "--runs-dir", str(tmp_path), "--seeds", "0", "--arms", "pcl-async",
                                "uniform-async"])
    assert not any(key.startswith("pcl overhead") for key in figures["ratios"])
    assert ("PCL's overhead (1-rank learner, one step ahead): no step 3 or later in the runs of pcl-async or "
            "uniform-async (a longer --budget)") in capsys.readouterr().out
