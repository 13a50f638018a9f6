"""Losing the Ray head of the docker-compose deployment, for real (`make test-deploy-head`): with GCS fault
tolerance (the head keeps Ray's state in `gcs-redis`, a Redis of its own) the cluster outlives its head.

The cpu profile comes up as a compose project of its own; a detached sentinel actor is placed on the rollout worker
node (node affinity, no restarts allowed); the tiny run goes in as a Ray job with a checkpoint every few steps, and
mid-run the head container is killed (`docker kill`) and started again. Then, from 127.0.0.1 and the compose
network only:

- the worker nodes are still in the cluster with the node ids they had, and their containers were never restarted;
  the head came back as a new node, the old one dead;
- the sentinel answers from the same process on the same node (its actor was never restarted);
- the job's driver ran on the head and ended with it, and with it every actor of the run, on the workers too:
  Ray ends an actor whose owner is gone. That is expected and not counted as survival: the test checks that each of
  them is dead and why;
- the job submitted again with `--resume` continues from the newest complete checkpoint, to the last step, and
  `pcl chaos-check`, run on the head against the deployment's Redis, finds every invariant held: steps once and in
  order, exact batches, versions, the TensorBoard tracker, the streams' entries accounted for, never two live
  incarnations of one actor, nothing stale trained on;
- the GCS process killed inside the head: the container exits, its restart policy starts it again, and the sentinel
  is still there.

Also: gcs-redis asks for its own password, holds Ray's tables under the cluster's namespace, and the work Redis none
of them; the password is in no log of the head nor any file of its Ray sessions.

Slow (minutes) and run only with PCL_TEST_DEPLOY=1 (`make test-deploy-head`); elsewhere it skips, saying so. It
prints its timings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.actors.faults import FAST
from tests.deploy.compose import (REPO, Deployment, compose_cluster, run_dir_steps, sh, state,
                                  wait_for_workers)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PCL_TEST_DEPLOY") != "1",
                       reason="builds images and runs containers: `make test-deploy-head` (PCL_TEST_DEPLOY=1)"),
]
STEPS, EVERY = 60, 10  # the head is lost past the second checkpoint (step 22), with most of the run to go
RUN = ["/opt/pcl/configs/tiny.yaml", "control.host=0.0.0.0", "rollout.resources={rollout: 1}",
       "verifier.resources={rollout: 0.5}", "learner.resources={learner: 1}", "value.resources={learner: 0.5}",
       *[a for a in FAST if not a.startswith("control.port=")], f"run.steps={STEPS}", f"checkpoint.every={EVERY}",
       "logging.backends=[console, jsonl, tensorboard]"]
RUN_DIR = "/runs/tiny"
WORKERS = ("ray-cpu-worker-rollout", "ray-cpu-worker-learner")
TIMINGS: dict[str, float] = {}
# A detached actor on the node of the container it is started from; `start` places it (or finds the one placed),
# `where` finds it by name; either prints its process and node.
SENTINEL = """
import json, os, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

@ray.remote(num_cpus=0, max_restarts=0)
class Sentinel:
    def where(self):
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

ray.init(address="auto", namespace="pcl-test", logging_level="ERROR", log_to_driver=False)
if sys.argv[1] == "start":
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = Sentinel.options(name="sentinel", lifetime="detached", scheduling_strategy=here,
                             get_if_exists=True).remote()
else:
    actor = ray.get_actor("sentinel")
print(json.dumps(ray.get(actor.where.remote(), timeout=120)))
"""


@pytest.fixture(scope="module")
def deployment():
    try:
        with compose_cluster("head", TIMINGS) as d:
            yield d
    finally:
        print("\ntest-deploy-head timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in TIMINGS.items()))


def sentinel(d: Deployment, action: str) -> dict:
    out = sh("docker", "exec", "-i", d.container("ray-cpu-worker-rollout"), "python3", "-", action,
             timeout=180, env=d.env, input_text=SENTINEL)
    return json.loads(out.strip().splitlines()[-1])


def submit(d: Deployment, *extra: str) -> subprocess.Popen:
    """`pcl train` of the run as a Ray job, through the submit-cpu service (its output: the job's log)."""
    return subprocess.Popen(["docker", "compose", "-p", d.project, "--profile", "cpu", "run", "--rm", "-T",
                             "submit-cpu", "train", RUN[0], "--run-dir", RUN_DIR, *extra, *RUN[1:]],
                            cwd=REPO, env=d.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def worker_nodes(d: Deployment) -> dict[str, str]:
    """Alive worker nodes: the custom resource each offers -> its node id."""
    return {r: n["node_id"] for n in state(d, "nodes") if n["state"] == "ALIVE"
            for r in ("rollout", "learner") if r in n["resources_total"]}


def head_nodes(d: Deployment) -> dict[str, str]:
    return {n["node_id"]: n["state"] for n in state(d, "nodes") if "head" in n["resources_total"]}


def wait_healthy(d: Deployment, service: str, timeout_s: float = 300, restarts: int | None = None) -> float:
    """Seconds until the service's container reports healthy (after `restarts` restarts by its policy, if given)."""
    started, container = time.monotonic(), d.container(service)
    while True:
        count, health = sh("docker", "inspect", "-f", "{{.RestartCount}} {{.State.Health.Status}}",
                           container).split()
        if health == "healthy" and (restarts is None or int(count) >= restarts):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"{service} not healthy after {timeout_s} s: {health}"
        time.sleep(1)


def started_at(d: Deployment, service: str) -> str:
    return sh("docker", "inspect", "-f", "{{.RestartCount}} {{.State.StartedAt}}", d.container(service)).strip()


def test_gcs_redis_is_rays_own_and_asks_for_its_password(deployment):
    d = deployment
    refused = d.compose("exec", "-T", "-e", "REDISCLI_AUTH=", "gcs-redis", "redis-cli", "ping", check=False)
    assert "NOAUTH" in refused, refused
    config = d.compose("exec", "-T", "gcs-redis", "redis-cli", "config", "get", "maxmemory-policy").split()
    assert config[-1] == "noeviction"
    keys = d.compose("exec", "-T", "gcs-redis", "redis-cli", "--scan").split()
    assert {"RAYpcl@NODE", "RAYpcl@KV"} <= set(keys), keys  # RAY<namespace>@<table>
    work = d.compose("exec", "-T", "redis", "redis-cli", "--scan", "--pattern", "RAY*").split()
    assert work == []  # the work streams' Redis holds none of Ray's tables


@dataclass
class Before:
    """What the cluster was before its head was lost."""
    sentinel: dict  # the detached sentinel's process and node
    workers: dict[str, str]  # worker_nodes()
    heads: dict[str, str]  # head_nodes()
    containers: dict[str, str]  # each worker container's restart count and start time

    @classmethod
    def seen(cls, d: Deployment) -> Before:
        placed, workers = sentinel(d, "start"), worker_nodes(d)
        assert placed["node_id"] == workers["rollout"]
        return cls(placed, workers, head_nodes(d), {s: started_at(d, s) for s in WORKERS})

    def outlived(self, d: Deployment) -> None:
        """The same worker nodes, their containers never restarted, the sentinel in the same process; the head
        a new node, the old one dead."""
        def new_head() -> None:
            now = head_nodes(d)
            assert [h for h, s in now.items() if s == "ALIVE" and h not in self.heads] and \
                all(now.get(h) == "DEAD" for h in self.heads), (self.heads, now)

        eventually(new_head)
        assert worker_nodes(d) == self.workers
        assert {s: started_at(d, s) for s in WORKERS} == self.containers
        assert sentinel(d, "where") == self.sentinel
        found = next(a for a in state(d, "actors") if a["class_name"] == "Sentinel")
        assert found["state"] == "ALIVE" and int(found.get("num_restarts", 0)) == 0, found


def test_the_head_lost_mid_run_keeps_the_workers_and_the_job_resumes_from_its_checkpoint(deployment, tmp_path):
    d = deployment
    TIMINGS["workers_joined_s"] = wait_for_workers(d)
    before = Before.seen(d)
    lost_after = lose_the_head_mid_run(d, tmp_path / "job-1.log")
    before.outlived(d)

    # The run's actors belonged to its driver, which ran on the head: all ended with it, as Ray ends an actor whose
    # owner is gone, on the workers as well. Expected, and no survival.
    def all_dead() -> list[dict]:
        actors = run_actors(d)
        assert actors and all(a["state"] == "DEAD" for a in actors), [(a["class_name"], a["state"]) for a in actors]
        return actors

    ended = eventually(all_dead)
    assert {a["class_name"] for a in ended} >= {"Coordinator", "RolloutWorker", "LearnerRank", "RewardVerifier"}
    print("the run's actors ended with their driver:", sorted({(a["class_name"], death(a)) for a in ended}))

    started = time.monotonic()
    out = run_job(d, tmp_path / "job-2.log", "--resume")
    TIMINGS["resumed_job_s"] = time.monotonic() - started
    assert "succeeded" in out.lower(), out[-4000:]
    resumed = re.search(r"pcl: resuming from \S+/step-(\d+) \(step (\d+)\)", out)
    assert resumed and EVERY <= int(resumed[2]) <= lost_after, out[-4000:]
    print(f"resumed from the checkpoint of step {int(resumed[2])}")

    check = d.compose("exec", "-T", "ray-cpu-head", "pcl", "chaos-check", RUN[0], "--run-dir", RUN_DIR,
                      *RUN[1:], check=False)
    print(check)
    assert "result: PASS" in check, check
    assert f"PASS steps: steps 1..{STEPS} each once" in check and "PASS trackers" in check
    memory = d.compose("exec", "-T", "gcs-redis", "redis-cli", "info", "memory")
    print("gcs-redis", re.search(r"used_memory_human:\S+", memory)[0], "after both jobs")


def lose_the_head_mid_run(d: Deployment, log: Path) -> int:
    """Submit the run, kill the head container past the second checkpoint and start it again; the steps logged
    by then. The job is lost with its head: its submitter fails."""
    started = time.monotonic()
    job = submit(d)
    try:
        deadline = time.monotonic() + 900
        while len(run_dir_steps(d)) < 2 * EVERY + 2:
            assert job.poll() is None and time.monotonic() < deadline, "the run ended before the head was lost"
            time.sleep(1)
        lost_after = len(run_dir_steps(d))
        TIMINGS["submit_to_head_lost_s"] = time.monotonic() - started
        head = d.container("ray-cpu-head")
        sh("docker", "kill", head)
        sh("docker", "start", head)
        TIMINGS["head_back_s"] = wait_healthy(d, "ray-cpu-head")
        out, _ = job.communicate(timeout=300)  # the submitter lost the job server: it ends
    finally:
        if job.poll() is None:
            job.kill()
    log.write_text(out)
    assert job.returncode != 0, out[-3000:]
    print(f"\nthe head was killed after step {lost_after} was logged; it served again "
          f"{TIMINGS['head_back_s']:.1f} s after its start")
    return lost_after


def run_job(d: Deployment, log: Path, *extra: str) -> str:
    job = submit(d, *extra)
    try:
        out, _ = job.communicate(timeout=900)
    finally:
        if job.poll() is None:
            job.kill()
    log.write_text(out)
    assert job.returncode == 0, out[-4000:]
    return out


def eventually(check, timeout_s: float = 120):
    """check()'s value once it stops failing (an AssertionError: also the state API not answering yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def run_actors(d: Deployment) -> list[dict]:
    """The actors of the run (every job's but the sentinel's and Ray's own job supervisors)."""
    return [a for a in state(d, "actors") if a["class_name"] not in ("Sentinel", "JobSupervisor")]


def death(actor: dict) -> str:
    message = (actor.get("death_cause") or {}).get("actor_died_error_context", {}).get("error_message", "")
    return "owner died" if "owner has died" in message else "node died" if "node has died" in message else message[:80]


def test_the_gcs_process_lost_the_head_restarts_by_its_policy_and_the_sentinel_stays(deployment):
    d = deployment
    placed = sentinel(d, "start")
    restarts = int(started_at(d, "ray-cpu-head").split()[0])
    pid = d.compose("exec", "-T", "ray-cpu-head", "sh", "-c",
                    'for p in /proc/[0-9]*; do case "$(tr "\\0" " " < $p/cmdline 2>/dev/null)" in '
                    '*/gcs_server\\ *) echo ${p#/proc/};; esac; done').split()
    assert len(pid) == 1, pid
    d.compose("exec", "-T", "ray-cpu-head", "kill", "-9", pid[0])
    TIMINGS["gcs_killed_head_back_s"] = wait_healthy(d, "ray-cpu-head", restarts=restarts + 1)
    assert sentinel(d, "where") == placed


def test_the_gcs_redis_password_is_in_no_log_of_the_head(deployment):
    """Ray has it on the head's command lines only (docs/deploy.md): not in the container's log, nor in any file of
    Ray's sessions there (the runs' drivers' logs included)."""
    d = deployment
    password = d.secrets["RAY_GCS_REDIS_PASSWORD"]
    logs = d.compose("logs", "ray-cpu-head")
    assert "Ray runtime started" in logs and password not in logs
    files = d.compose("exec", "-T", "ray-cpu-head", "sh", "-c", 'grep -rlF -- "$0" /tmp/ray; echo searched',
                      password)
    assert files.split() == ["searched"], files.split()
