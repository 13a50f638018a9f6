"""The chaos cluster: docker-compose.yml's cpu profile with deploy/chaos-cluster.yml (two rollout nodes, a learner
node, the delay proxy in front of Redis), as a compose project of its own on free 127.0.0.1 ports with fresh
secrets, and what the faults do to its containers: docker kill / start / pause / unpause, and packet filters in a
node's network namespace (`nsenter -n -t PID iptables ...`, as root: the images carry no iptables).

    cluster = ChaosCluster(out)          # out/runs is /runs on every Ray node; out/chaos holds delay.json
    cluster.up()
    cluster.drop(node, peers=[cluster.ip("redis")])   # cut the node off from those addresses
    cluster.heal(node)
    cluster.down(); cluster.leftovers()  # {"containers": [], "networks": [], "volumes": []} once cleaned up
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = ("docker-compose.yml", "deploy/chaos-cluster.yml")
SERVICES = {"head": "ray-cpu-head", "rollout": "ray-cpu-worker-rollout", "rollout2": "ray-cpu-worker-rollout2",
            "learner": "ray-cpu-worker-learner", "redis": "redis", "proxy": "redis-delay"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*args: str, timeout: float = 120, check: bool = True, env: dict | None = None) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:] or proc.stdout[-2000:]}")
    return proc.stdout


class ChaosCluster:
    def __init__(self, out: Path, project: str | None = None):
        self.out = out = Path(out).resolve()  # compose reads a relative bind-mount source as a volume's name
        self.runs, self.chaos = out / "runs", out / "chaos"
        for d in (self.runs, self.chaos):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o777)  # the containers' user (pcl, uid 1000) writes the run there
        (self.chaos / "delay.json").write_text(json.dumps({"delay_ms": {}}))
        self.project = project or f"pclchaos{os.getpid()}"
        self.ports = {n: free_port() for n in ("PCL_CONTROL_PORT", "RAY_DASHBOARD_PORT", "PROMETHEUS_PORT",
                                               "GRAFANA_PORT", "CHAOS_REDIS_PORT")}
        self.secrets = {k: secrets.token_hex(16) for k in ("PCL_API_TOKEN", "REDIS_PASSWORD", "RAY_AUTH_TOKEN",
                                                         "RAY_GCS_REDIS_PASSWORD")}
        self.env = {**os.environ, **{k: str(v) for k, v in self.ports.items()}, **self.secrets,
                    "CHAOS_RUNS_DIR": str(self.runs), "CHAOS_DIR": str(self.chaos)}
        self._ids: dict[str, str] = {}
        self._delays: dict[str, float] = {}

    # -- compose ----------------------------------------------------------------------------------------------

    def compose_args(self) -> list[str]:
        return ["docker", "compose", "-p", self.project, *(a for f in FILES for a in ("-f", f)), "--profile", "cpu"]

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        return sh(*self.compose_args(), *args, timeout=timeout, check=check, env=self.env)

    def up(self) -> None:
        self.compose("up", "-d", "--wait", "--no-build", timeout=900)
        for node, service in SERVICES.items():
            self._ids[node] = self.compose("ps", "-aq", service).strip()
            if not self._ids[node]:
                raise RuntimeError(f"no container for {service}")
        self.wait_joined()

    def alive_nodes(self) -> list[dict]:
        """The cluster's alive Ray nodes (Ray's state API on the published dashboard port, with the token); none
        while it does not answer."""
        import urllib.request

        request = urllib.request.Request(self.url("RAY_DASHBOARD_PORT", "/api/v0/nodes?detail=1&limit=1000"),
                                         headers={"Authorization": f"Bearer {self.secrets['RAY_AUTH_TOKEN']}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                data = json.loads(answer.read())["data"]["result"]
        except (OSError, ValueError, KeyError):
            return []
        nodes = data["result"] if isinstance(data, dict) else data
        return [n for n in nodes if n.get("state") == "ALIVE"]

    def wait_joined(self, timeout_s: float = 600.0) -> None:
        """Until both rollout nodes and the learner node have joined the head."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            resources = [n.get("resources_total", {}) for n in self.alive_nodes()]
            if sum("rollout" in r for r in resources) >= 2 and any("learner" in r for r in resources):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker nodes did not all join the head within {timeout_s:g} s: {resources}")
            time.sleep(2)

    def down(self) -> None:
        for node in SERVICES:  # a paused container stops only once resumed
            if self._ids.get(node):
                sh("docker", "unpause", self._ids[node], check=False)
        self.compose("down", "-v", "--remove-orphans", "--timeout", "5", timeout=300, check=False)

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        return {"containers": sh("docker", "ps", "-aq", "--filter", label).split(),
                "networks": sh("docker", "network", "ls", "-q", "--filter", label).split(),
                "volumes": sh("docker", "volume", "ls", "-q", "--filter", label).split()}

    def url(self, port: str, path: str = "") -> str:
        return f"http://127.0.0.1:{self.ports[port]}{path}"

    @property
    def redis_url(self) -> str:
        """The run's Redis from the host (published on 127.0.0.1 for the invariants)."""
        return f"redis://:{self.secrets['REDIS_PASSWORD']}@127.0.0.1:{self.ports['CHAOS_REDIS_PORT']}/0"

    # -- containers -------------------------------------------------------------------------------------------

    def container(self, node: str) -> str:
        return self._ids[node]

    def hostnames(self) -> dict[str, str]:
        """Each container's hostname (what an actor's heartbeat names as its host) -> its node name."""
        out = {}
        for node, cid in self._ids.items():
            out[sh("docker", "inspect", "-f", "{{.Config.Hostname}}", cid, check=False).strip() or cid[:12]] = node
        return out

    def pid(self, node: str) -> int:
        return int(sh("docker", "inspect", "-f", "{{.State.Pid}}", self._ids[node]).strip() or 0)

    def ip(self, node: str) -> str:
        return sh("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                  self._ids[node]).strip()

    def docker(self, verb: str, node: str, check: bool = True) -> str:
        """docker kill / start / pause / unpause of a node's container."""
        return sh("docker", verb, self._ids[node], check=check, timeout=180)

    def state(self, node: str) -> str:
        return sh("docker", "inspect", "-f", "{{.State.Status}}", self._ids[node], check=False).strip()

    def top(self, node: str) -> list[tuple[int, str]]:
        """(host pid, command line) of each process in a node's container."""
        rows = sh("docker", "top", self._ids[node], "-eo", "pid,args", check=False).splitlines()[1:]
        return [(int(r.split(None, 1)[0]), r.split(None, 1)[1] if len(r.split(None, 1)) > 1 else "") for r in rows]

    # -- packet filters in a node's network namespace -----------------------------------------------------------

    def iptables(self, node: str, *rule: str) -> None:
        pid = self.pid(node)
        if not pid:
            raise RuntimeError(f"{node} is not running")
        sh("nsenter", "-n", "-t", str(pid), "iptables", "-w", *rule)

    def drop(self, node: str, peers: list[str] | None = None, probability: float | None = None) -> None:
        """Drop the node's packets to and from `peers` (addresses), or every packet but its loopback's (None);
        with `probability`, that share of them at random."""
        rand = ["-m", "statistic", "--mode", "random", "--probability", f"{probability:g}"] if probability else []
        for peer in peers or [None]:
            for chain, way, lo in (("INPUT", "-s", "-i"), ("OUTPUT", "-d", "-o")):
                match = [way, peer] if peer else ["!", lo, "lo"]
                self.iptables(node, "-I", chain, *match, *rand, "-j", "DROP")

    def heal(self, node: str) -> None:
        """Remove the node's packet filters (a container started again since has none left)."""
        if self.state(node) == "running":
            for chain in ("INPUT", "OUTPUT"):
                self.iptables(node, "-F", chain)

    def delay(self, node: str, ms: float) -> None:
        """Delay the node's Redis traffic by `ms` each way (0: no more), in the delay proxy's settings (read by
        the proxy within 0.2 s)."""
        ip = self.ip(node)
        if ms:
            self._delays[ip] = ms
        else:
            self._delays.pop(ip, None)
        tmp = self.chaos / "delay.json.tmp"
        tmp.write_text(json.dumps({"delay_ms": self._delays}))
        tmp.chmod(0o644)
        tmp.replace(self.chaos / "delay.json")
