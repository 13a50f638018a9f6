"""Ray's own growth over a long run is bounded where `start_ray()` starts a local Ray (actors/runtime.py,
RAY_LIMITS): the GCS keeps a bounded number of task events, and every log file, a worker's .out/.err included,
rotates at a bounded size. Read from the processes this test's Ray started: the GCS server's environment, and an
actor's."""

from __future__ import annotations

import os
from pathlib import Path

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
    for key in RAY_LIMITS:
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


@pytest.mark.slow
def test_the_gcs_forgets_evicted_task_attempts_beyond_its_bound(ray_session):
    """Once the GCS holds RAY_task_events_max_num_task_in_gcs tasks' events, each new actor call evicts one, and the
    GCS remembers every evicted attempt (per job: one set for a whole run, about 16 actor calls a step) to drop its
    late events, up to RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs (Ray's default: 1,000,000;
    the GCS server's memory grows with it: docs/operations.md, "Long runs"). With the bound, the GCS's clean-up
    (every 5 s) evicts that set down to it and says so in gcs_server.out; enough calls to pass the bound here."""
    import re
    import time

    import ray

    key = "RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs"
    gcs = _own_ray_process("gcs_server")
    bound = int(RAY_LIMITS[key])  # the GCS's own may differ (set in the environment): it must evict at this one too
    stored = int(gcs.environ().get("RAY_task_events_max_num_task_in_gcs", 100_000))
    log_dir = next(a.split("=", 1)[1] for a in gcs.cmdline() if a.startswith("--log_dir="))

    @ray.remote(num_cpus=0)
    class Echo:
        def call(self) -> int:
            return 0

    echo = Echo.remote()
    try:
        for _ in range(0, stored + 2 * bound + 5_000, 1_000):
            ray.get([echo.call.remote() for _ in range(1_000)], timeout=300)
    finally:
        ray.kill(echo)
    said = re.compile(r"Evict extra dropped task attempts\((\d+) > (\d+)\)")
    deadline, found = time.monotonic() + 120, []
    while not found and time.monotonic() < deadline:  # the clean-up runs every 5 s; the log is flushed as it writes
        text = "".join(p.read_text(errors="replace") for p in sorted(Path(log_dir).glob("gcs_server.out*")))
        found = said.findall(text)
        time.sleep(1)
    assert found, (f"{stored + 2 * bound + 5_000} actor calls, and the GCS never evicted the task attempts it "
                   f"remembers ({key} = {gcs.environ().get(key, 'unset: 1000000')})")
    assert max(int(limit) for _, limit in found) <= bound
