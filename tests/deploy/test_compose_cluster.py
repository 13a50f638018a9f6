"""The docker-compose deployment, run for real (`make test-deploy`): the images are built (deploy/build.sh), the
cpu profile comes up (Redis, a Ray head, two CPU worker containers, Prometheus), the tiny run goes in as a Ray job
through the submit-cpu service, and the test checks, from 127.0.0.1 and the compose network only:

- the job completes its steps, every step logged once with exact batches;
- the rollout and learner actors ran on the worker containers (Ray's state API on the published dashboard port,
  with the cluster's token; without it the API refuses);
- the control plane answers through its published port, and a mutation needs the token;
- Redis refuses clients without its password and has its memory cap;
- the containerised Prometheus scraped `pcl_effective_ratio` (its query API);
- the rollout worker container, killed mid-run (`docker kill`) and started again, is survived in place;
- `docker compose down -v` leaves no container, network or volume of the project.

Slow (minutes: image builds, a Ray cluster of containers on a shared machine) and run only by `make test-deploy`,
which sets PCL_TEST_DEPLOY=1; elsewhere it skips, saying so. It prints its timings."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse

import pytest

from tests.actors.faults import FAST, assert_each_step_once_and_exact_batches, steps_logged
from tests.deploy.compose import (REPO, Deployment, compose_cluster, http, run_dir_steps, sh, state,
                                  wait_for_workers)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PCL_TEST_DEPLOY") != "1",
                       reason="builds images and runs containers: `make test-deploy` (PCL_TEST_DEPLOY=1)"),
]
STEPS = 40  # ~0.3 s each: the kill after step 2 lands well before the end
PLACEMENT = ["rollout.resources={rollout: 1}", "verifier.resources={rollout: 0.5}",
             "learner.resources={learner: 1}", "value.resources={learner: 0.5}"]
RUN = [a for a in FAST if not a.startswith("control.port=")] + [f"run.steps={STEPS}"]
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def deployment():
    try:
        with compose_cluster("", TIMINGS) as d:
            yield d
    finally:
        print("\ntest-deploy timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in TIMINGS.items()))


def test_redis_asks_for_its_password_and_caps_its_memory(deployment):
    d = deployment
    refused = d.compose("exec", "-T", "-e", "REDISCLI_AUTH=", "redis", "redis-cli", "ping", check=False)
    assert "NOAUTH" in refused, refused
    assert d.compose("exec", "-T", "redis", "redis-cli", "ping").strip() == "PONG"
    config = d.compose("exec", "-T", "redis", "redis-cli", "config", "get", "maxmemory*").split()
    assert config[config.index("maxmemory") + 1] == str(2 * 1024**3)
    assert config[config.index("maxmemory-policy") + 1] == "noeviction"


def test_the_tiny_run_as_a_ray_job_survives_a_killed_worker_container(deployment, tmp_path):
    d = deployment
    status, _ = http(d.url("RAY_DASHBOARD_PORT", "/api/v0/nodes"))
    assert status in (401, 403), status  # the job API and the state API ask for Ray's token
    TIMINGS["workers_joined_s"] = wait_for_workers(d)
    rollout_ips = {d.ip("ray-cpu-worker-rollout")}
    learner_ip = d.ip("ray-cpu-worker-learner")
    started = time.monotonic()
    job = subprocess.Popen(["docker", "compose", "-p", d.project, "--profile", "cpu", "run", "--rm", "-T",
                            "submit-cpu", "train", "/opt/pcl/configs/tiny.yaml", "--run-dir", "/runs/tiny",
                            "control.host=0.0.0.0", *PLACEMENT, *RUN],
                           cwd=REPO, env=d.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The control plane, published on 127.0.0.1: reads are open, a mutation needs the token.
        deadline = time.monotonic() + 600
        while (status := http(d.url("PCL_CONTROL_PORT", "/v1/status"))[0]) != 200:
            assert job.poll() is None and time.monotonic() < deadline, "the control plane never answered"
            time.sleep(1)
        TIMINGS["submit_to_control_plane_s"] = time.monotonic() - started
        params = d.url("PCL_CONTROL_PORT", "/v1/params")
        assert http(params, "PATCH", body={"tau": 0.5})[0] == 401
        assert http(params, "PATCH", token="wrong", body={"tau": 0.5})[0] == 401
        assert http(params, "PATCH", token=d.secrets["PCL_API_TOKEN"], body={"tau": 0.5})[0] == 202
        # The rollout worker's container dies mid-run and comes back (as a restarted host would).
        while len(run_dir_steps(d)) < 2:
            assert job.poll() is None and time.monotonic() < deadline, "the run ended before step 2"
            time.sleep(1)
        killed_at_step = len(run_dir_steps(d)) + 1
        rollout = d.container("ray-cpu-worker-rollout")
        old_node = next(n["node_id"] for n in state(d, "nodes")
                        if n["state"] == "ALIVE" and "rollout" in n["resources_total"])
        sh("docker", "kill", rollout)
        time.sleep(3)
        sh("docker", "start", rollout)
        rollout_ips.add(d.ip("ray-cpu-worker-rollout"))
        out, _ = job.communicate(timeout=900)
        TIMINGS["job_s"] = time.monotonic() - started
    finally:
        if job.poll() is None:
            job.kill()
    (tmp_path / "job.log").write_text(out)
    assert job.returncode == 0 and "succeeded" in out.lower(), out[-4000:]

    d.compose("cp", "ray-cpu-head:/runs/tiny", str(tmp_path / "run"))
    assert steps_logged(tmp_path / "run") == list(range(1, STEPS + 1))
    records = assert_each_step_once_and_exact_batches(tmp_path / "run", STEPS)
    assert records[-1]["dead_letters"] == 0
    # The restarted rollout worker gets the current weights from the retried weight sync (when the kill fell in
    # one) or from the coordinator's fleet check (`worker_reloads`): either way the batches above are exact.
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["restarts"] == 0  # no checkpoint restart
    slowest = max(records, key=lambda r: r["step_seconds"])
    TIMINGS["step_with_the_kill_s"] = slowest["step_seconds"]
    print(f"\nkilled after step {killed_at_step - 1} was logged; step {slowest['step']} took "
          f"{slowest['step_seconds']:.1f} s, the others {min(r['step_seconds'] for r in records):.1f}-"
          f"{sorted(r['step_seconds'] for r in records)[-2]:.1f} s")
    assert slowest["step"] >= killed_at_step - 1 and slowest["step"] < STEPS  # the kill fell mid-run

    check_placement(d, old_node, rollout_ips, learner_ip)


def check_placement(d: Deployment, old_node: str, rollout_ips: set[str], learner_ip: str) -> None:
    """Where the run's actors ran and how its placement groups asked for them, from Ray's state API."""
    # Where the actors ran, from Ray's state API: the rollout worker and verifier on the rollout worker container
    # (before and after its restart), the learner ranks and the value scorer on the learner worker container.
    nodes = state(d, "nodes")
    ips = {n["node_id"]: n["node_ip"] for n in nodes}
    new_node = next(n["node_id"] for n in nodes if n["state"] == "ALIVE" and "rollout" in n["resources_total"])
    assert new_node != old_node  # the started container joined as a new node
    rollout_now = next(a for a in state(d, "actors") if a["class_name"] == "RolloutWorker")
    assert rollout_now["node_id"] == new_node  # restarted there, in place (dead now: its job has ended)
    placed: dict[str, set[str]] = {}
    for actor in state(d, "actors"):
        if actor.get("node_id"):
            placed.setdefault(actor["class_name"], set()).add(ips[actor["node_id"]])
    print("actors by node ip:", {k: sorted(v) for k, v in placed.items()}, "rollout", rollout_ips,
          "learner", learner_ip)
    assert placed["RolloutWorker"] and placed["RolloutWorker"] <= rollout_ips
    assert placed["RewardVerifier"] <= rollout_ips
    assert placed["LearnerRank"] == {learner_ip} and placed["ValueScorerActor"] == {learner_ip}
    # The run's placement groups (pcl.tools.placement): the learner's and V's (PACK) and the rollout engine's
    # (STRICT_PACK), each bundle with the role's custom resource, all removed with the run.
    named = [g for g in state(d, "placement_groups") if g.get("name")]
    groups = {role: next((g for g in named if g["name"].endswith(f"-{role}")), None)
              for role in ("learner", "value", "rollout-0")}
    print("placement groups:", {role: g and (g["state"], [b.get("unit_resources") for b in g.get("bundles") or []])
                                for role, g in groups.items()})
    assert all(g is not None and g["state"] == "REMOVED" for g in groups.values()), groups
    for role, resource in (("learner", "learner"), ("value", "learner"), ("rollout-0", "rollout")):
        assert all(resource in b.get("unit_resources", {}) for b in groups[role]["bundles"]), groups[role]


def test_prometheus_in_its_container_scraped_the_run(deployment):
    d = deployment
    query = "count_over_time(pcl_effective_ratio[1h])"
    status, body = http(d.url("PROMETHEUS_PORT", "/api/v1/query?" + urllib.parse.urlencode({"query": query})))
    assert status == 200, body[:500]
    result = json.loads(body)["data"]["result"]
    assert result and float(result[0]["value"][1]) >= 1, body[:1000]


def test_compose_down_leaves_nothing_behind(deployment):
    d = deployment
    assert any(d.leftovers().values())
    started = time.monotonic()
    d.down()
    TIMINGS["down_s"] = time.monotonic() - started
    assert d.leftovers() == {"containers": [], "networks": [], "volumes": []}
