"""`pcl train --local` is the reference the fleet must match: in deterministic mode, a one-rank, one-worker config
run in one process (`entrypoints.local`) and on local Ray with an embedded Redis (`entrypoints.train`) trains the
same steps, for PCL and uniform selection, on the warm-started tiny model.

Compared exactly (==, floats included): every figure of every step record except the timings and the stream
counters a process has none of (named below), the prompts and sample indices each step trained on
(selections.jsonl), the final policy (learner.pt: float32 master weights and AdamW state) and V (trainer.pt).
Equal weights after 2 steps (the second generated with the weights the first synced) mean equal batches (token
ids, rewards, advantages) at every step; the records carry V's predictions (selected_value_mean, the probe's
explained variance), the rewards and the losses. Both paths run every part with one torch thread
(rollout.threads=1; the fleet's learner and V ranks are pinned to 1)."""

from __future__ import annotations

import pytest
import torch

from pcl.config import load_config
from pcl.loop.runlog import read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.redis]
STEPS = 2
SETTINGS = [f"run.steps={STEPS}", "run.m=8", "run.n=4", "run.eval_every=0", "data.tiny_size=256",
            "value.ev_sample=4", "value.ev_every=1", "learner.num_ranks=1", "rollout.num_workers=1",
            "rollout.threads=1", "verifier.processes=1", "rollout.deterministic=true", "control.enabled=false",
            "run.time_budget_s=null", "logging.backends=[jsonl]"]
# What differs by construction: durations, and what only a fleet has (a stream's drops and dead letters, worker
# restarts, hand-overs from stragglers). Nothing else may.
TIMINGS = ("_seconds",)
FLEET_ONLY = ("dropped_", "dead_letters", "worker_reloads", "handed_over_", "stuck_restarts_")


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.endswith(TIMINGS) and not k.startswith(FLEET_ONLY)}


def final_state(run_dir, name: str) -> dict:
    return torch.load(run_dir / "checkpoints" / f"step-{STEPS:06d}" / name, map_location="cpu", weights_only=True)


@pytest.mark.parametrize("selection", [["selection.type=pcl", "selection.k=2"], ["selection.type=uniform"]],
                         ids=["pcl", "uniform"])
def test_local_and_fleet_train_the_same_steps(tiny_model, ray_session, tmp_path, selection):
    from entrypoints.local import run_local
    from entrypoints.train import run_training

    cfg = load_config("configs/tiny.yaml", [f"model.path={tiny_model}", *selection, *SETTINGS])
    assert run_local(cfg, run_dir=str(tmp_path / "local")) == 0
    assert run_training(cfg, run_dir=str(tmp_path / "fleet")) == 0

    local, fleet = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("local", "fleet"))
    assert [r["step"] for r in local] == [r["step"] for r in fleet] == list(range(1, STEPS + 1))
    assert {k for r in fleet for k in r} - {k for r in local for k in r} <= {
        k for r in fleet for k in r if k.startswith(FLEET_ONLY)}
    for a, b in zip(local, fleet):
        assert comparable(a) == comparable(b), a["step"]
    assert local[-1]["grad_norm"] > 0 and 0 < local[-1]["effective_ratio"]  # the steps trained on something
    selections = [(tmp_path / name / "selections.jsonl").read_text() for name in ("local", "fleet")]
    assert selections[0] == selections[1]

    a, b = final_state(tmp_path / "local", "learner.pt"), final_state(tmp_path / "fleet", "learner.pt")
    assert a["steps"] == b["steps"] == STEPS and a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    if cfg.selection.type == "pcl":
        va = final_state(tmp_path / "local", "value/trainer.pt")["model"]
        vb = final_state(tmp_path / "fleet", "value/trainer.pt")["model"]
        assert all(torch.equal(va[k], vb[k]) for k in va)
        assert all(r["selected_value_mean"] is not None for r in local)
