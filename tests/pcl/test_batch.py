"""Assembling a step's verified samples into groups and the learner's batch."""

import numpy as np
import pytest

from pcl.loop.batch import group_samples, shard_sequences, training_sequences
from pcl.samples import Sample
from pcl.loop.runlog import MetricsLog, format_step_line, read_metrics


def sample(pid: str, j: int, reward: float, resp=(5, 6)) -> Sample:
    return Sample(pid, j, (1, 2, 3), tuple(resp), reward, "stop")


def test_groups_follow_selection_order_and_sample_index():
    samples = [sample("b", 1, 1.0), sample("a", 0, 0.0), sample("b", 0, 0.0), sample("a", 1, 1.0)]
    g = group_samples(samples, ["b", "a"], n=2)
    assert g.prompt_ids == ["b", "a"]
    np.testing.assert_array_equal(g.rewards, [[0.0, 1.0], [0.0, 1.0]])
    np.testing.assert_array_equal(g.pass_rates, [0.5, 0.5])


def test_missing_doubled_or_foreign_samples_are_errors():
    with pytest.raises(ValueError, match="missing"):
        group_samples([sample("a", 0, 1.0)], ["a"], n=2)
    with pytest.raises(ValueError, match="twice"):
        group_samples([sample("a", 0, 1.0), sample("a", 0, 1.0)], ["a"], n=1)
    with pytest.raises(ValueError, match="do not belong"):
        group_samples([sample("a", 0, 1.0), sample("z", 0, 1.0)], ["a"], n=1)


def test_only_nonzero_advantages_are_trained_on():
    # group a: rewards (1, 0, 0, 0) -> mean 0.25 -> advantages (0.75, -0.25, -0.25, -0.25)
    # group b: all correct -> advantages all 0 -> no sequence sent
    samples = [sample("a", j, r) for j, r in enumerate([1, 0, 0, 0])] + [sample("b", j, 1.0) for j in range(4)]
    seqs = training_sequences(group_samples(samples, ["a", "b"], n=4))
    assert [s["advantage"] for s in seqs] == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert all(s["prompt_token_ids"] == [1, 2, 3] for s in seqs)


def test_shards_balance_tokens_and_keep_every_sequence():
    seqs = [{"prompt_token_ids": [0] * 3, "response_token_ids": [0] * k, "advantage": 1.0} for k in (9, 1, 1, 5, 4, 2, 2)]
    shards = shard_sequences(seqs, 2)
    tokens = [sum(len(s["prompt_token_ids"]) + len(s["response_token_ids"]) for s in sh) for sh in shards]
    assert sum(len(s) for s in shards) == 7
    assert abs(tokens[0] - tokens[1]) <= 3
    assert shard_sequences(seqs, 2) == shards  # deterministic
    assert shard_sequences([], 3) == [[], [], []]
    with pytest.raises(ValueError):
        shard_sequences(seqs, 0)


def test_metrics_log_is_strict_json_and_survives_a_torn_line(tmp_path):
    log = MetricsLog(tmp_path)
    log.append({"step": 1, "effective_ratio": 0.5, "value_explained_variance": float("nan"), "x": np.float32(2.5)})
    log.append({"step": 2, "effective_ratio": 0.25})
    with open(log.path, "a") as f:
        f.write('{"step": 3, "effecti')  # a crash mid-write
    records = read_metrics(log.path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["value_explained_variance"] is None and records[0]["x"] == 2.5
    log.truncate_after(1)
    assert [r["step"] for r in read_metrics(log.path)] == [1]
    line = format_step_line({"step": 1, "effective_ratio": 0.5, "eval_accuracy": 0.25}, 10)
    assert "step    1/10" in line and "eff 0.50" in line and "eval_acc 0.250" in line


def test_summary_of_a_run():
    from pcl.loop.runlog import summarize

    records = [{"step": 0, "eval_accuracy": 0.2}]
    records += [{"step": s, "effective_ratio": 0.5, "step_seconds": 2.0, "generation_seconds": 1.0,
                 "selection_seconds": 0.1, "value_explained_variance": ev} for s, ev in [(1, -1.0), (2, 0.4), (3, 0.6)]]
    records[-1].update(eval_accuracy=0.35, elapsed_seconds=9.0, train_elapsed_seconds=6.5)
    s = summarize(records)
    assert s["elapsed_seconds"] == 9.0 and s["train_elapsed_seconds"] == 6.5
    assert s["steps"] == 3 and s["eval_accuracy_start"] == 0.2 and s["eval_accuracy_final"] == 0.35
    assert s["eval_gain_points"] == pytest.approx(15.0)
    assert s["value_explained_variance_late"] == pytest.approx(0.5)  # the second half: steps 2 and 3
    assert s["effective_ratio_mean"] == 0.5


def test_summary_carries_the_held_out_standard_errors():
    from pcl.loop.runlog import format_step_line, summarize

    records = [{"step": 0, "eval_accuracy": 0.2, "eval_accuracy_se": 0.03},
               {"step": 1, "effective_ratio": 0.5, "step_seconds": 1.0, "eval_accuracy": 0.35, "eval_accuracy_se": 0.04}]
    s = summarize(records)
    assert s["eval_accuracy_se_start"] == 0.03 and s["eval_accuracy_se_final"] == 0.04
    assert s["eval_gain_se_points"] == pytest.approx(5.0)  # hypot(3, 4) points
    assert "eval_acc 0.350 ± 0.040" in format_step_line(records[1], 1)
    older = summarize(records[:1] + [{"step": 1, "eval_accuracy": 0.3}])  # a record written without its SE
    assert older["eval_accuracy_se_final"] is None and "eval_gain_se_points" not in older


def test_summary_report_prints_the_standard_errors(tmp_path):
    from pcl.loop.runlog import MetricsLog, summary_report

    log = MetricsLog(tmp_path)
    log.append({"step": 0, "eval_accuracy": 0.2, "eval_accuracy_se": 0.03})
    log.append({"step": 1, "effective_ratio": 0.5, "step_seconds": 1.0, "eval_accuracy": 0.35, "eval_accuracy_se": 0.04})
    assert "held-out accuracy 0.200 ± 0.030 -> 0.350 ± 0.040 (best 0.350), +15.0 ± 5.0 points" in summary_report([tmp_path])


def test_the_summary_counts_the_steps_the_curriculum_spent_stalled(tmp_path):
    from pcl.loop.runlog import MetricsLog, format_step_line, summarize, summary_report

    stalled = [0, 0, 1, 2, 0, 1]
    records = [{"step": s, "effective_ratio": 0.5, "step_seconds": 1.0, "curriculum_gain": g, "curriculum_stalled": k}
               for s, (g, k) in enumerate(zip([0.2, 0.1, 0.0, 0.01, 0.1, -0.05], stalled), start=1)]
    s = summarize(records)
    assert s["curriculum_stalled_steps"] == 3 and s["curriculum_gain_late"] == pytest.approx(0.02)  # steps 4-6
    assert summarize([{"step": 1, "effective_ratio": 0.5}])["curriculum_stalled_steps"] is None  # no V: no figure
    line = format_step_line(records[2], 6)
    assert "CURRICULUM NOT PAYING (gain over uniform +0.000" in line and "raise k, move tau" in line
    assert "CURRICULUM" not in format_step_line(records[3], 6)  # said once, the step it stalls
    log = MetricsLog(tmp_path)
    for r in records:
        log.append(r)
    assert ("curriculum: gain over uniform selection +0.020 (effective ratio, second half); 3 of 6 steps stalled"
            in summary_report([tmp_path]))
