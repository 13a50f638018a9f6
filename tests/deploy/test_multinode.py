"""The service on a Ray cluster of three nodes on this machine, started with `ray start` as on real hosts: a head
(the driver's node) and two workers offering the custom resources `rollout` and `learner`, which the run config's
placement fields ask for. The tiny training runs to completion with its actors spread across the nodes as asked;
the rollout node is killed mid-run and replaced, and the run recovers (Ray restarts the rollout worker and the
verifier on the new node; the coordinator gives the worker the current weights); and `ray job submit` of
`pcl train` against the cluster works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.actors.faults import FAST, assert_each_step_once_and_exact_batches, checkpoint_written, steps_logged
from tests.deploy.ray_cluster import RAY, LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.redis]
REPO = Path(__file__).resolve().parents[2]
PLACEMENT = ["rollout.resources={rollout: 1}", "verifier.resources={rollout: 0.5}",
             "learner.resources={learner: 1}", "value.resources={learner: 0.5}"]


@pytest.fixture(scope="module")
def cluster():
    from pcl.tiny.build import build_tiny

    build_tiny(seed=0)
    c = LocalCluster.start({"head": 1})
    try:
        c.add_node("rollout", {"rollout": 2})
        c.add_node("learner", {"learner": 3})  # two learner ranks (1 each) and the value scorer (0.5)
        yield c
    finally:
        c.stop()


def env_for(cluster: LocalCluster) -> dict:
    return {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "disabled"}


def train(cluster: LocalCluster, run_dir: Path, *extra: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "services.cli", "train", "configs/tiny.yaml", *FAST, *PLACEMENT, *extra,
            "--run-dir", str(run_dir)]
    return subprocess.Popen(args, cwd=REPO, env=env_for(cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def actor_nodes(cluster: LocalCluster) -> dict[str, set[str]]:
    """Node ids each actor class ran on (dead actors included), from the head's state API."""
    from ray.util.state import list_actors

    out: dict[str, set[str]] = {}
    for a in list_actors(address=cluster.dashboard, detail=True, limit=10_000):
        if a.node_id:
            out.setdefault(a.class_name, set()).add(a.node_id)
    return out


def test_actors_are_placed_on_the_nodes_offering_their_resources(cluster, tmp_path):
    run = train(cluster, tmp_path / "run", "run.steps=3")
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 0, out[-3000:]
    assert steps_logged(tmp_path / "run") == [1, 2, 3]
    nodes, placed = cluster.node_ids(), actor_nodes(cluster)
    assert placed["RolloutWorker"] == {nodes["rollout"]}
    assert placed["RewardVerifier"] == {nodes["rollout"]}
    assert placed["LearnerRank"] == {nodes["learner"]}
    assert placed["ValueScorerActor"] == {nodes["learner"]}
    spread = {n for ids in placed.values() for n in ids}
    assert {nodes["rollout"], nodes["learner"]} <= spread


def test_a_lost_rollout_node_is_replaced_and_the_run_recovers(cluster, tmp_path):
    run_dir = tmp_path / "run"
    run = train(cluster, run_dir, "run.steps=6", "checkpoint.every=2", "rollout.max_in_flight=1")
    try:
        deadline = time.monotonic() + 300
        while not checkpoint_written(run_dir, 2):
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before step 2"
            time.sleep(0.2)
        lost = next(n for n in cluster.nodes if n.name == "rollout")
        old_id = cluster.node_ids()["rollout"]
        assert lost.kill(), "no process of the rollout node found"
        cluster.nodes.remove(lost)
        time.sleep(3)  # the node is gone; a replacement comes up, as KubeRay would replace the pod
        cluster.add_node("rollout", {"rollout": 2})
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    (tmp_path / "driver.log").write_text(out)
    assert run.returncode == 0, "\n".join(line for line in out.splitlines() if "XREADGROUP" not in line)[-4000:]
    assert_each_step_once_and_exact_batches(run_dir, 6)
    new_id = cluster.node_ids()["rollout"]
    assert new_id != old_id and new_id in actor_nodes(cluster)["RolloutWorker"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == 0  # recovered in place: Ray restarted the actors on the new node


def test_ray_job_submit_runs_pcl_train_on_the_cluster(cluster, tmp_path):
    run_dir = tmp_path / "run"
    entry = [str(Path(sys.executable).with_name("pcl")), "train", str(REPO / "configs" / "tiny.yaml"), *FAST,
             *PLACEMENT, "run.steps=2", "--run-dir", str(run_dir)]
    job = subprocess.run([RAY, "job", "submit", f"--address={cluster.dashboard}", "--", *entry], cwd=REPO,
                         env=env_for(cluster), capture_output=True, text=True, timeout=600)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-3000:]
    assert "succeeded" in out.lower() and steps_logged(run_dir) == [1, 2]
