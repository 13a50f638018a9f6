"""The run config's `ray` section (pcl/config_ray.py): Ray's health checks and head timeout, in Ray's names and
units for a local Ray's system config and for `ray start`'s environment on a cluster's nodes."""

from __future__ import annotations

from pcl.config import load_config


def test_the_ray_section_speaks_rays_names_and_units():
    """docs/operations.md, "Timeouts on a cluster": the `ray` section as Ray's system config (milliseconds where Ray
    counts them) and as `ray start`'s environment, and the node-death window it makes."""
    ray = load_config(None, ["ray.health_check_period_s=2.5", "ray.health_check_failure_threshold=4"]).ray
    assert ray.system_config() == {"health_check_period_ms": 2500, "health_check_timeout_ms": 10000,
                                   "health_check_failure_threshold": 4, "gcs_rpc_server_reconnect_timeout_s": 60}
    assert ray.ray_start_env()["RAY_health_check_period_ms"] == "2500"
    assert ray.node_death_s() == (10.0, 4 * 10.0 + 3 * 2.5)
