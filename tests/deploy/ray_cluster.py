"""A Ray cluster of several nodes on this one machine, started with the `ray` CLI as an operator would (a head
and worker nodes offering custom resources), and stopped node by node without touching any other Ray on the
machine: every process of a node is found by the unique ports and temp dir it was started with, and by descent
from those (the workers its raylet started)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports() -> list[str]:
    """Ports a node would otherwise take by default (and collide on, with several nodes on one machine)."""
    names = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
    return [f"{name}={free_port()}" for name in names]


def _cmdlines() -> dict[int, str]:
    """pid -> command line (arguments joined by spaces) of every live process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return out


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
    return out


@dataclass
class Node:
    name: str
    resources: dict
    marker: str  # a port only this node's processes carry on their command lines

    def processes(self) -> dict[int, str]:
        """This node's processes (pid -> command line): those carrying its marker (raylet, agents) and all their
        descendants (the workers its raylet started, whose command lines are their `ray::Class` titles)."""
        cmdlines, parents = _cmdlines(), _parents()
        mine = {pid for pid, cmdline in cmdlines.items() if self.marker in cmdline and pid != os.getpid()}
        children = mine
        while children:
            children = {pid for pid, parent in parents.items() if parent in children} - mine
            mine |= children
        return {pid: cmdlines.get(pid, "") for pid in sorted(mine)}

    def kill(self, sig: int = signal.SIGKILL) -> dict[int, str]:
        """Signal every process of the node (as a lost host or pod would lose them); returns those signalled."""
        found = self.processes()
        for pid in found:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return found


@dataclass
class LocalCluster:
    temp_dir: str
    port: int
    dashboard_port: int
    nodes: list[Node] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @classmethod
    def start(cls, head_resources: dict) -> "LocalCluster":
        temp_dir = tempfile.mkdtemp(prefix="pclray", dir="/tmp")  # short: Ray's socket paths must stay short
        cluster = cls(temp_dir, free_port(), free_port())
        ports = _ports()
        cluster._run(["start", "--head", f"--port={cluster.port}", f"--dashboard-port={cluster.dashboard_port}",
                      "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
                      f"--ray-client-server-port={free_port()}", "--num-cpus=1", "--disable-usage-stats",
                      f"--resources={json.dumps(head_resources)}", *ports])
        cluster.nodes.append(Node("head", head_resources, f"--gcs_server_port={cluster.port}"))
        cluster.nodes[0].marker = ports[0].replace("--node-manager-port=", "node_manager_port=")
        return cluster

    def add_node(self, name: str, resources: dict, num_cpus: int = 1) -> Node:
        ports = _ports()
        self._run(["start", f"--address={self.address}", f"--num-cpus={num_cpus}", "--disable-usage-stats",
                   f"--resources={json.dumps(resources)}", *ports])
        node = Node(name, resources, ports[0].replace("--node-manager-port=", "node_manager_port="))
        self.nodes.append(node)
        return node

    def node_ids(self) -> dict[str, str]:
        """Alive nodes' ids by the name of the custom resource only they offer."""
        from ray.util.state import list_nodes

        out = {}
        for n in list_nodes(address=self.dashboard, detail=True):
            if n.state == "ALIVE":
                for name in n.resources_total:
                    if name in ("head", "rollout", "learner"):
                        out[name] = n.node_id
        return out

    def stop(self) -> None:
        """End every process of this cluster (SIGTERM, then SIGKILL) and remove its temp dir."""
        for node in reversed(self.nodes):
            node.kill(signal.SIGTERM)
        time.sleep(2)
        for node in reversed(self.nodes):
            node.kill(signal.SIGKILL)
        for entry in Path("/proc").iterdir():  # workers and agents started under this cluster's temp dir
            if entry.name.isdigit():
                try:
                    if self.temp_dir.encode() in (entry / "cmdline").read_bytes():
                        os.kill(int(entry.name), signal.SIGKILL)
                except (OSError, ProcessLookupError):
                    pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _run(self, args: list[str]) -> None:
        env = {**os.environ, "RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled"}
        run = subprocess.run([RAY, *args], capture_output=True, text=True, timeout=120, env=env)
        if run.returncode != 0:
            raise RuntimeError(f"ray {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}")
