"""The `ray` section of the run config: Ray's own timeouts that decide a node or the head is lost
(docs/operations.md, "Timeouts on a cluster").

Where `pcl train` starts a local Ray these go to it as its system config (`system_config`); a cluster's Ray takes
them from the environment of `ray start` on each node (`ray_start_env`: the head's GCS runs the health checks, every
node's raylet and workers wait for a lost head), which a deployment sets once (docker-compose.yml does).

    ray.init(_system_config=cfg.ray.system_config())
    RAY_health_check_period_ms=3000 ... ray start --head        # cfg.ray.ray_start_env()
"""

from __future__ import annotations

from pydantic import Field

from pcl.config_base import Section


class RayConfig(Section):
    health_check_period_s: float = Field(3.0, gt=0, description="Seconds between the head's health checks of "
                                         "each node (Ray's health_check_period_ms).")
    health_check_timeout_s: float = Field(10.0, gt=0, description="Seconds a node has to answer one health check "
                                          "(Ray's health_check_timeout_ms).")
    health_check_failure_threshold: int = Field(5, ge=1, description="Health checks in a row a node fails before "
                                                "the head declares it dead and its actors are restarted "
                                                "elsewhere: a node frozen or cut off is given up after about "
                                                "threshold x timeout + (threshold - 1) x period, 62 s by default.")
    gcs_reconnect_timeout_s: int = Field(60, ge=1, description="Seconds a node's raylet and workers keep trying "
                                         "to reach a head (its GCS) that is gone before they exit (Ray's "
                                         "gcs_rpc_server_reconnect_timeout_s).")
    placement_timeout_s: float = Field(300.0, gt=0, description="Seconds a starting (or resumed) driver waits for "
                                       "its placement groups before the run is refused: for resources other runs "
                                       "hold, and for a node with room for a group that is out of the cluster "
                                       "now (lost, restarting, cut off from the head). Not a setting of Ray's.")

    def node_death_s(self) -> tuple[float, float]:
        """About the least and the most seconds from a node's loss to the head declaring it dead. The head checks
        a node, waits for the answer up to the timeout, and checks again a period after that answer: a node that
        refuses at once (its raylet gone, the host up) fails threshold checks a period apart; one that does not
        answer (frozen, cut off, powered off) fails threshold checks of a timeout each, a period apart."""
        n = self.health_check_failure_threshold
        period, timeout = self.health_check_period_s, self.health_check_timeout_s
        return n * period, n * timeout + (n - 1) * period

    def system_config(self) -> dict[str, int]:
        """Ray's own names and units, for `ray.init(_system_config=...)` of a local Ray."""
        return {"health_check_period_ms": round(self.health_check_period_s * 1000),
                "health_check_timeout_ms": round(self.health_check_timeout_s * 1000),
                "health_check_failure_threshold": self.health_check_failure_threshold,
                "gcs_rpc_server_reconnect_timeout_s": self.gcs_reconnect_timeout_s}

    def ray_start_env(self) -> dict[str, str]:
        """The same as environment variables of `ray start` on a cluster's nodes."""
        return {f"RAY_{name}": str(value) for name, value in self.system_config().items()}
