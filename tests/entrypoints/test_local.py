"""`pcl train CONFIG --local` (entrypoints/local.py) on real parts in this process: the HF engine, the FSDP2
learner at world size 1 on gloo, V, the reward pool's math-verify processes, and the control plane over an
embedded Redis. The embedded default (configs/tiny-carry.yaml, its shipped policy), cut to a few small steps."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from pcl.config import load_config
from pcl.loop.runlog import read_metrics

pytestmark = [pytest.mark.redis]
TOKEN = "local-run-test-token-0123456789abcdef"
SMALL = ["run.m=16", "run.n=4", "run.eval_every=2", "data.eval_size=32", "data.tiny_size=256", "value.ev_sample=8",
         "rollout.max_new_tokens=64", "control.port=0", f"control.token={TOKEN}", "run.time_budget_s=null",
         "logging.backends=[console,jsonl]", "rollout.threads=1"]  # one thread: a loaded machine's cores are busy


def wait_for(condition, what: str, timeout_s: float = 300.0):
    """condition()'s first truthy value, asked every 0.1 s (the event is the answer); fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"no {what} within {timeout_s:g}s")


def control_url(run_dir) -> str | None:
    path = run_dir / "control.json"
    return json.loads(path.read_text()).get("url") if path.is_file() else None


def test_the_embedded_default_runs_local_pauses_through_its_control_plane_and_resumes(tmp_path, capsys):
    from entrypoints.local import run_local

    run_dir, result = tmp_path / "run", {}
    cfg = load_config("configs/tiny-carry.yaml", ["run.steps=2", *SMALL])
    thread = threading.Thread(target=lambda: result.update(code=run_local(cfg, run_dir=str(run_dir))), daemon=True)
    thread.start()
    url = wait_for(lambda: control_url(run_dir), "control plane")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=10) as api:
        assert api.post("/v1/pause", headers=auth).status_code == 202  # held at the next step boundary
        wait_for(lambda: api.get("/v1/status").json().get("state") == "paused", "pause")
        metrics = api.get("/metrics").text
        assert 'pcl_paused{run="tiny-carry"} 1.0' in metrics and 'pcl_tau{run="tiny-carry"} 0.5' in metrics
        assert api.post("/v1/resume", headers=auth).status_code == 202
        events = [e["type"] for e in api.get("/v1/events").json()]
    thread.join(timeout=600)
    assert result.get("code") == 0, result
    assert "paused" in events
    printed = capsys.readouterr().out
    assert "pcl: --local: one process on cpu, torch threads 1 (rollout.threads); mapped to one: " \
           "learner.num_ranks 2 -> 1" in printed
    assert "step    2/2" in printed and "held-out accuracy" in printed
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[0]["eval_accuracy"] > 0 and records[2]["eval_accuracy"] is not None  # step 0 and the last
    assert all(r["rollout_samples_by_worker"] == {"rollout-0": r["samples_generated"] + r["probe_samples"]}
               for r in records[1:])
    assert (run_dir / "checkpoints" / "step-000002" / "COMPLETE").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2

    # --resume: the same run goes on from its last checkpoint to a third step
    assert run_local(load_config("configs/tiny-carry.yaml", ["run.steps=3", *SMALL]), run_dir=str(run_dir),
                     resume="") == 0
    assert "pcl: restored step 2 (policy version 2)" in capsys.readouterr().out
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3] and records[3]["policy_version"] == 3


@pytest.mark.parametrize("override, named", [("cluster.nodes=2", "cluster.nodes = 2"),
                                             ("learner.num_gpus_per_rank=1", "learner.num_gpus_per_rank = 1")])
def test_local_refuses_a_layout_it_cannot_map_before_anything_starts(tmp_path, capsys, override, named):
    from entrypoints.cli import main

    if override.startswith("learner.num_gpus") and __import__("torch").cuda.is_available():
        pytest.skip("this machine has the GPU the override asks for")
    code = main(["train", "configs/tiny.yaml", "--local", "--run-dir", str(tmp_path / "run"), override])
    assert code == 2 and capsys.readouterr().err.startswith(f"pcl: {named}: ")
    assert not (tmp_path / "run").exists()  # nothing written
