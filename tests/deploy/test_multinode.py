"""The service on a Ray cluster of three nodes on this machine, started with `ray start` as on real hosts:
a head (the driver's node) and two workers offering the custom resources `rollout` and `learner`, which the
run config's placement fields ask for.

- The tiny training runs to completion with its actors on the nodes their resources name.
- The rollout node is lost mid-generation (every process of it SIGKILLed, as when a host or pod dies) and a
  replacement joins: the run recovers in place (Ray restarts the rollout worker and the verifier on the new
  node, the coordinator gives the worker the current weights, the requests the dead worker held are reclaimed).
- `ray job submit -- pcl train ...` works, its driver joined to the cluster (Ray sets RAY_ADDRESS in a job's
  entrypoint).

Each test leaves `facts.json` in its tmp dir: where the actors ran, and the recovery's timing."""

from __future__ import annotations

import json
import os
import re
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
RUN_NAME = "tiny"  # configs/tiny.yaml's run.name: the run's streams are pcl:tiny:*


@pytest.fixture(scope="module")
def cluster(tiny_model):
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
    args = [sys.executable, "-m", "entrypoints.cli", "train", "configs/tiny.yaml", *FAST, *PLACEMENT, *extra,
            "--run-dir", str(run_dir)]
    return subprocess.Popen(args, cwd=REPO, env=env_for(cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def actor_nodes(cluster: LocalCluster, job_id: str | None = None) -> dict[str, set[str]]:
    """Node ids each actor class ran on (dead actors included; of one Ray job where given), from the head's state
    API. A restarted actor keeps its id and shows the node it runs on now."""
    from ray.util.state import list_actors

    filters = [("job_id", "=", job_id)] if job_id else None
    out: dict[str, set[str]] = {}
    for a in list_actors(address=cluster.dashboard, filters=filters, detail=True, limit=10_000):
        if a.node_id:
            out.setdefault(a.class_name, set()).add(a.node_id)
    return out


def named(placed: dict[str, set[str]], nodes: dict[str, str]) -> dict[str, list[str]]:
    """The same, with node ids replaced by the name of the node ('rollout', 'learner', 'head')."""
    names = {node_id: name for name, node_id in nodes.items()}
    return {cls: sorted(names.get(n, n[:8]) for n in ids) for cls, ids in sorted(placed.items())}


def held_by_rollout_workers(client) -> int:
    """Rollout requests a worker has read but not yet acknowledged: a generation is under way."""
    import redis

    try:
        return int(client.xpending(f"pcl:{RUN_NAME}:rollout_requests", "rollout")["pending"])
    except redis.ResponseError:  # the stream or its group not created yet
        return 0


def test_actors_are_placed_on_the_nodes_offering_their_resources(cluster, tmp_path):
    started = time.monotonic()
    run = train(cluster, tmp_path / "run", "run.steps=3")
    try:
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out[-3000:]
    assert steps_logged(tmp_path / "run") == [1, 2, 3]
    nodes, placed = cluster.node_ids(), actor_nodes(cluster)
    (tmp_path / "facts.json").write_text(json.dumps({"seconds": time.monotonic() - started,
                                                     "placed": named(placed, nodes)}, indent=1))
    assert placed["RolloutWorker"] == {nodes["rollout"]}
    assert placed["RewardVerifier"] == {nodes["rollout"]}
    assert placed["LearnerRank"] == {nodes["learner"]}
    assert placed["ValueScorerActor"] == {nodes["learner"]}
    assert placed["Coordinator"] == placed["PromptSamplerActor"] == {nodes["head"]}  # the driver's node


def test_a_lost_rollout_node_is_replaced_and_the_run_recovers(cluster, tmp_path):
    import redis

    run_dir, started = tmp_path / "run", time.monotonic()
    run = train(cluster, run_dir, "run.steps=6", "checkpoint.every=2", "rollout.max_in_flight=1")
    try:
        deadline = time.monotonic() + 300
        while not checkpoint_written(run_dir, 2):
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before step 2"
            time.sleep(0.2)
        # The node goes while its worker holds requests of a later step (read from the run's embedded Redis).
        client = redis.Redis(unix_socket_path=str(run_dir / "redis" / "redis.sock"))
        while not held_by_rollout_workers(client):
            assert run.poll() is None and steps_logged(run_dir)[-1] < 6, "no generation seen after step 2"
            time.sleep(0.01)
        client.close()
        at_step = len(steps_logged(run_dir)) + 1
        lost = next(n for n in cluster.nodes if n.name == "rollout")
        old_id = cluster.node_ids()["rollout"]
        killed, killed_at = lost.kill(), time.monotonic()
        cluster.nodes.remove(lost)
        titles = [c.split()[0] for c in killed.values() if c]
        assert any(t.endswith("/raylet") for t in titles), killed
        assert any(t.startswith("ray::RolloutWorker") for t in titles), killed  # the worker died with its node
        time.sleep(3)  # the node is gone; a replacement comes up, as KubeRay would replace the pod
        cluster.add_node("rollout", {"rollout": 2})
        while len(steps_logged(run_dir)) < at_step and run.poll() is None:
            time.sleep(0.2)
        recovered_in = time.monotonic() - killed_at
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    (tmp_path / "driver.log").write_text(out)
    assert run.returncode == 0, "\n".join(line for line in out.splitlines() if "XREADGROUP" not in line)[-4000:]
    records = assert_each_step_once_and_exact_batches(run_dir, 6)
    nodes, placed = cluster.node_ids(), actor_nodes(cluster)
    (tmp_path / "facts.json").write_text(json.dumps({
        "seconds": time.monotonic() - started, "killed_during_step": at_step, "killed": titles,
        "step_seconds": {r["step"]: round(r["step_seconds"], 2) for r in records},
        "seconds_from_kill_to_that_step_logged": recovered_in, "placed": named(placed, nodes)}, indent=1))
    assert nodes["rollout"] != old_id
    assert nodes["rollout"] in placed["RolloutWorker"] and nodes["rollout"] in placed["RewardVerifier"]
    assert records[-1]["worker_reloads"] >= 1  # the restarted worker got the current weights
    assert records[-1]["dead_letters"] == 0  # it took no request before it had them (none given up on)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == 0  # recovered in place: Ray restarted the actors on the new node


def test_ray_job_submit_runs_pcl_train_on_the_cluster(cluster, tmp_path):
    from ray.job_submission import JobSubmissionClient

    run_dir, started = tmp_path / "run", time.monotonic()
    entry = [str(Path(sys.executable).with_name("pcl")), "train", str(REPO / "configs" / "tiny.yaml"), *FAST,
             *PLACEMENT, "run.steps=2", "--run-dir", str(run_dir)]
    job = subprocess.run([RAY, "job", "submit", f"--address={cluster.dashboard}", "--", *entry], cwd=REPO,
                         env={k: v for k, v in env_for(cluster).items() if k != "RAY_ADDRESS"},
                         capture_output=True, text=True, timeout=600)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-3000:]
    assert "succeeded" in out.lower() and steps_logged(run_dir) == [1, 2]
    # The entrypoint ran with RAY_ADDRESS set by Ray (the driver warns about the embedded Redis only then) and
    # its driver joined this cluster: the job's actors are in its state, on the nodes their resources name.
    assert "no redis.url / REDIS_URL with a Ray cluster" in out
    submission = re.search(r"Job '(raysubmit_\w+)' submitted successfully", out).group(1)
    job_id = JobSubmissionClient(cluster.dashboard).get_job_info(submission).job_id
    nodes, placed = cluster.node_ids(), actor_nodes(cluster, job_id)
    (tmp_path / "facts.json").write_text(json.dumps({"seconds": time.monotonic() - started, "job_id": job_id,
                                                     "placed": named(placed, nodes)}, indent=1))
    assert placed["RolloutWorker"] == {nodes["rollout"]} and placed["LearnerRank"] == {nodes["learner"]}
    assert placed["Coordinator"] == {nodes["head"]}  # the job's driver runs on the head
