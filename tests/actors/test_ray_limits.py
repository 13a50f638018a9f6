"""Ray's own growth over a long run is bounded where `start_ray()` starts a local Ray (actors/runtime.py,
RAY_LIMITS): the GCS keeps a bounded number of task events, and every log file, a worker's .out/.err included,
rotates at a bounded size. Read from the processes this test's Ray started: the GCS server's environment, and an
actor's."""

from __future__ import annotations

import os

import psutil
import pytest

from actors.runtime import RAY_LIMITS

pytestmark = pytest.mark.ray


def _own_ray_process(name: str) -> psutil.Process:
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if proc.name() == name:
                return proc
        except psutil.Error:
            continue
    pytest.skip(f"no {name} among this process's children: Ray was not started here (RAY_ADDRESS?)")


def test_a_local_ray_starts_with_its_growth_bounded(ray_session):
    import ray

    assert int(RAY_LIMITS["RAY_task_events_max_num_task_in_gcs"]) <= 20_000
    assert int(RAY_LIMITS["RAY_ROTATION_MAX_BYTES"]) * (int(RAY_LIMITS["RAY_ROTATION_BACKUP_COUNT"]) + 1) <= 256 << 20
    gcs = _own_ray_process("gcs_server").environ()
    for key in ("RAY_task_events_max_num_task_in_gcs", "RAY_ROTATION_MAX_BYTES", "RAY_ROTATION_BACKUP_COUNT"):
        assert gcs.get(key) == os.environ.get(key, RAY_LIMITS[key]), key

    @ray.remote(num_cpus=0)
    class Probe:
        def env(self, key: str) -> str | None:
            return os.environ.get(key)

    probe = Probe.remote()
    try:  # a worker's .out/.err rotate only when it sees RAY_ROTATION_MAX_BYTES (ray/_private/workers/default_worker.py)
        assert ray.get(probe.env.remote("RAY_ROTATION_MAX_BYTES"), timeout=120) == gcs["RAY_ROTATION_MAX_BYTES"]
    finally:
        ray.kill(probe)


def test_a_local_ray_takes_the_ray_sections_health_checks(ray_session):
    """`start_ray(settings)` gives the run config's `ray` section to the local Ray as its system config: the GCS
    server, which runs the health checks, starts with it (its --config_list, base64 JSON)."""
    import base64
    import json

    from pcl.config_ray import RayConfig

    args = [a for a in _own_ray_process("gcs_server").cmdline() if a.startswith("--config_list=")]
    assert args, "the GCS server started without a system config"
    config = json.loads(base64.b64decode(args[0].split("=", 1)[1]))
    assert RayConfig().system_config().items() <= config.items(), config
