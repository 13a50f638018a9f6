"""The FSDP2-sharded value model across two real gloo processes against one unsharded ValueTrainer (today's
`value.num_ranks: 1`): the same updates within 1e-5, scoring copies refreshed after every step, checkpoints
that load into either, and a bad share that fails every rank instead of hanging one."""

from __future__ import annotations

import json

import pytest
import torch

from pcl.models.value import ValueTrainer
from tests.pcl import value_worker as worker

ATOL = 1e-5


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _unsharded(model_dir) -> ValueTrainer:
    return ValueTrainer(worker.randomised_model(str(model_dir)), grad_clip=worker.GRAD_CLIP,
                        batch_size=worker.BATCH_SIZE, **worker.ADAM)


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    out = worker.run_ranks(2, tiny_model_dir, tmp_path_factory.mktemp("value_2"))
    stats = [json.loads((out / f"stats.rank{r}.json").read_text()) for r in (0, 1)]
    return out, stats, torch.load(out / "results.rank0.pt")


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir):
    trainer = _unsharded(tiny_model_dir)
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    stats, weights = [], []
    for prompts, targets, _ in worker.STEPS:
        stats.append(trainer.train_step(prompts, targets))
        weights.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
    return {"initial": initial, "stats": stats, "weights": weights, "scores": trainer.score(worker.PROMPTS)}


def test_two_ranks_take_the_same_steps_as_one(two_ranks, one_rank):
    _, stats, results = two_ranks
    assert _max_diff(one_rank["initial"], one_rank["weights"][0]) > 1e-3  # the steps move the weights visibly
    for step in (0, 1):
        assert _max_diff(results[f"weights{step}"], one_rank["weights"][step]) < ATOL, step
        reference = one_rank["stats"][step]
        assert reference["grad_norm"] > worker.GRAD_CLIP  # the clip bit: it must use the global norm
        for rank in (0, 1):
            got = stats[rank]["steps"][step]
            assert got["loss"] == pytest.approx(reference["loss"], abs=ATOL)
            assert got["grad_norm"] == pytest.approx(reference["grad_norm"], rel=ATOL)
            assert got["num_prompts"] == reference["num_prompts"] and got["skipped"] == 0.0


def test_every_ranks_scoring_copy_is_refreshed_after_each_step(two_ranks, one_rank):
    _, _, results = two_ranks
    assert results["scorer_gap0"] == 0.0 and results["scorer_gap1"] == 0.0  # float32 copy: exactly the weights
    assert torch.allclose(results["scores"].double(), torch.as_tensor(one_rank["scores"]), atol=ATOL)
    scores_rank1 = torch.load(two_ranks[0] / "results.rank1.pt")["scores"]
    assert torch.equal(results["scores"], scores_rank1)


def test_a_sharded_checkpoint_resumes_sharded_and_unsharded(two_ranks, one_rank, tiny_model_dir):
    out, stats, results = two_ranks
    assert _max_diff(results["resumed"], results["weights1"]) < 1e-6
    assert stats[0]["steps"][2]["loss"] == pytest.approx(stats[0]["steps"][1]["loss"], abs=1e-6)
    unsharded = _unsharded(tiny_model_dir)
    unsharded.load_checkpoint(out / "checkpoint")  # the unsharded trainer reads the sharded one's files
    assert unsharded.steps == 1
    prompts, targets, _ = worker.STEPS[1]
    unsharded.train_step(prompts, targets)
    assert _max_diff(unsharded.model.state_dict(), one_rank["weights"][1]) < ATOL


def test_a_bad_share_fails_every_rank_and_the_group_goes_on(two_ranks):
    _, stats, _ = two_ranks
    assert "pass rates must be in [0, 1]" in stats[1]["bad"]
    assert "another value rank rejected its share" in stats[0]["bad"]
    assert stats[0]["after_bad_loss"] == stats[1]["after_bad_loss"] > 0
    assert stats[0]["steps_b"] == stats[1]["steps_b"] == 3  # resumed at 1, two good steps, the bad one skipped
