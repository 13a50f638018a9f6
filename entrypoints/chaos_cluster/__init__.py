"""`pcl chaos-cluster` (`make test-chaos-cluster`): the tiny run as a Ray job on a Ray cluster of containers (the
compose cpu profile with two rollout nodes and a learner node, deploy/chaos-cluster.yml), under a seeded schedule
of node faults (pcl/tools/cluster_schedule.py: nodes killed, frozen, cut off from Redis, the head or both, lossy or
slow links, Redis restarted, the driver killed and the job resubmitted with --resume) with control-plane traffic
throughout; then the invariants of `pcl chaos-check` over the run's Redis and directory, the control traffic's
answers, the throughput after each partition, the containers cleaned up, and the report
(pcl/tools/cluster_report.py) in OUT/report.txt and OUT/report.json. docs/operations.md, "Chaos across machines".

    code = run_chaos_cluster(seed=1, out=Path("runs/chaos-cluster-seed1"))    # 0 when the report passed
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pcl.tools.chaos_checks import Check
from pcl.tools.cluster_schedule import CLUSTER_KINDS, ClusterSchedule, draw_cluster_schedule, schedule_steps

# The run: small fast steps (the tests' FAST sizes), two rollout workers and two verifiers (one of each per rollout
# node), checkpoints often (a lost learner rank restarts from one), restarts to spare, a tracker the checks read,
# deadlines that let a node frozen past Ray's node death (28 s here) be declared dead and replaced, and a
# remote call that waits on an actor of a lost node (a weight sync to its rollout worker) fail within a minute.
RUN_ARGS = ["run.m=8", "run.n=4", "run.eval_every=0", "data.tiny_size=256", "value.ev_sample=4", "selection.k=2",
            "run.time_budget_s=null", "rollout.max_new_tokens=8", "rollout.num_workers=2", "verifier.num_workers=2",
            "verifier.processes=1", "rollout.threads=1", "checkpoint.every=5", "checkpoint.max_restarts=60",
            "redis.visibility_timeout_s=10", "learner.timeout_s=60", "learner.ping_timeout_s=30",
            "rollout.step_timeout_s=600", "logging.backends=[console,jsonl,tensorboard]"]


def run_config(cluster, steps: int):
    """The run's config as the job trains it, with the run's Redis as the host reaches it (for the invariants)."""
    from entrypoints.chaos_cluster.compose import REPO
    from pcl.config import load_config

    return load_config(str(REPO / "configs" / "tiny.yaml"),
                       ["control.host=0.0.0.0", *RUN_ARGS, f"run.steps={steps}", f"redis.url={cluster.redis_url}"])


def run_chaos_cluster(seed: int, out: Path, per_kind: int = 2, kinds: tuple[str, ...] = tuple(CLUSTER_KINDS),
                      keep: bool = False, timeout_s: float = 3600.0) -> int:
    from entrypoints.chaos.traffic import ControlTraffic
    from entrypoints.chaos_cluster.compose import ChaosCluster
    from entrypoints.chaos_cluster.job import ClusterJob
    from entrypoints.chaos_cluster.nemesis import Nemesis

    out.mkdir(parents=True, exist_ok=True)
    if (out / "runs").is_dir() and any((out / "runs").iterdir()):
        raise SystemExit(f"pcl chaos-cluster: {out / 'runs'} holds an earlier run: give another --out")
    schedule = draw_cluster_schedule(seed, per_kind, kinds)
    (out / "schedule.json").write_text(schedule.to_json())
    steps = schedule_steps(schedule)
    replay = f"pcl chaos-cluster --seed {seed} --per-kind {per_kind} --kinds {','.join(kinds)}"
    cluster = ChaosCluster(out)
    job = nemesis = traffic = None
    checks: list[Check] = []
    try:
        started = time.monotonic()
        cluster.up()
        print(f"chaos-cluster: project {cluster.project} up in {time.monotonic() - started:.0f} s; {steps} steps, "
              f"{len(schedule.faults)} faults", flush=True)
        job = ClusterJob(cluster, [*RUN_ARGS, f"run.steps={steps}"], out / "job.log", steps)
        traffic = ControlTraffic(job, cluster.secrets["PCL_API_TOKEN"], out / "requests.jsonl")
        nemesis = Nemesis(schedule, cluster, job)
        job.start()
        traffic.start(0.0, ())
        nemesis.start()
        job.wait(timeout_s)
        nemesis.stop()
        traffic.stop()
        checks = final_checks(cluster, job, nemesis, traffic, steps)
    finally:
        if job is not None:
            job.stop()
        for node in ("rollout", "rollout2", "learner"):
            try:
                cluster.heal(node)
            except Exception:  # noqa: BLE001 - the cluster goes down next anyway
                pass
        hosts = _hosts(cluster)
        if not keep:
            cluster.down()
            left = cluster.leftovers()
            checks.append(Check("cleanup", not any(left.values()), "no container, network or volume of the project "
                                "left" if not any(left.values()) else f"left behind: {left}"))
    return report(schedule, job, nemesis, checks, hosts, out, replay, cluster)


def _hosts(cluster) -> dict[str, str]:
    try:
        return cluster.hostnames()
    except Exception:  # noqa: BLE001 - the report names hosts by their hostnames then
        return {}


def final_checks(cluster, job, nemesis, traffic, steps: int) -> list[Check]:
    """pcl chaos-check's invariants (entrypoints/chaos/check.py) over the run's Redis and directory, the control
    traffic's answers, every fault carried out, and the throughput after each partition."""
    from entrypoints.chaos.check import run_checks
    from entrypoints.chaos.final import read_run, read_run_events
    from pcl.tools.chaos_checks import check_control

    cfg = run_config(cluster, steps)
    reading = read_run(cfg, job.run_dir)
    checks = run_checks(cfg, reading)
    checks.append(check_control(traffic.requests, read_run_events(job.run_dir)))
    errors = nemesis.errors
    checks.append(Check("faults", not errors, "every scheduled fault carried out" if not errors
                        else "; ".join(errors)))
    job.incarnations = reading.incarnations or []
    job.last_record = next((r for r in reversed(reading.metrics) if "effective_ratio" in r), {})
    return checks


def report(schedule: ClusterSchedule, job, nemesis, checks: list[Check], hosts: dict[str, str], out: Path,
           replay: str, cluster) -> int:
    from pcl.tools.chaos_report import recover, steps_redone
    from pcl.tools.cluster_report import (build_cluster_report, check_throughput, format_cluster_report,
                                          throughput_back)
    from pcl.tools.partition_checks import stale_by_node

    commits = job.commits() if job is not None else []
    faults = recover(nemesis.results if nemesis else [], commits, job.finished_at if job else None)
    faults = [throughput_back(f, commits, faults) for f in faults]
    if job is not None and nemesis is not None:
        checks.insert(-1 if checks and checks[-1].name == "cleanup" else len(checks), check_throughput(faults))
    last = getattr(job, "last_record", {}) or {}
    stale = stale_by_node(last.get("dropped_stale_by_producer") or {}, getattr(job, "incarnations", []))
    stale = {hosts.get(h, h): c for h, c in stale.items()}
    run = {"steps": job.high if job else 0, "seconds": round(job.clock(), 1) if job else None,
           "finished": bool(job and job.finished), "error": job.error if job else "the cluster did not come up",
           "submissions": job.submissions if job else 0, "project": cluster.project}
    rep = build_cluster_report(schedule, faults, checks, run, steps_redone(job.timeline) if job else 0, stale, replay)
    rep["commits_s"] = [round(t, 2) for t in commits]  # the steps' commit times: the figures can be computed again
    text = format_cluster_report(rep, schedule)
    (out / "report.txt").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps(rep, indent=2, default=str))
    print(text, flush=True)
    return 0 if rep["passed"] else 1
