"""The cluster chaos run's view of its job (entrypoints/chaos_cluster/job.py), without Docker: what the control
traffic is told about the driver around a driver kill."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from entrypoints.chaos_cluster.job import ClusterJob


def test_the_driver_counts_as_down_from_the_moment_its_kill_is_announced(tmp_path: Path):
    # Seed 1 of the cluster chaos run: the control plane's requests in the seconds between the SIGKILL of the
    # driver and the end of its job submission were reset, and counted as failures, because the driver still
    # counted as up until the submission exited.
    cluster = SimpleNamespace(runs=tmp_path, url=lambda port, path="": "http://127.0.0.1:1")
    job = ClusterJob(cluster, [], tmp_path / "job.log", steps=10)
    job.driver.state = "up"
    assert job.control_up()
    job.expect_resume()
    assert not job.control_up() and job.phase() == "driver-down"
