"""The cluster chaos run's nemesis: the schedule's faults (pcl/tools/cluster_schedule.py) carried out on the chaos
cluster's containers, paced by the run's progress. A fault fires `after_steps` steps committed after every earlier
fault healed, or `overlap_s` seconds after the previous one was injected; it holds `hold_s` seconds, then heals.
Each fault's record: `injected_s` and `ended_s` (the heal) on the job's clock, and a note of what was done.

    nemesis = Nemesis(schedule, cluster, job)
    nemesis.start(); ...; nemesis.stop()
    nemesis.results        # one dict per fault: index, kind, target, injected_s, ended_s, note
"""

from __future__ import annotations

import threading
import time

from entrypoints.chaos.faults import checkpoint_complete
from pcl.tools.chaos_report import RUN_ENDED
from pcl.tools.cluster_schedule import ClusterFault, ClusterSchedule

POLL_S = 0.2
RESUBMIT_WAIT_S = 300.0


class Nemesis:
    def __init__(self, schedule: ClusterSchedule, cluster, job):
        self.schedule, self.cluster, self.job = schedule, cluster, job
        self.results = [{"index": f.index, "kind": f.kind, "target": f.target, "injected_s": None, "ended_s": None,
                         "regime": f.regime, "hold_s": f.hold_s, "note": ""} for f in schedule.faults]
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self) -> None:
        t = threading.Thread(target=self._run, name="chaos-nemesis", daemon=True)
        t.start()
        self.threads.append(t)

    def stop(self) -> None:
        self.stopped.set()
        for t in list(self.threads):
            t.join(timeout=300)

    def _run(self) -> None:
        for fault in self.schedule.faults:
            if not self._wait_turn(fault):
                break
            if self.job.driver.state in ("ending", "exited"):
                self.results[fault.index]["note"] = RUN_ENDED
                break
            t = threading.Thread(target=self._fire, args=(fault,), name=f"fault-{fault.index}", daemon=True)
            t.start()
            self.threads.append(t)
            while fault.overlap_s is None and self.results[fault.index]["injected_s"] is None and t.is_alive():
                time.sleep(POLL_S)  # the next overlap counts from this injection
        for fault in self.schedule.faults:
            if self.results[fault.index]["injected_s"] is None and not self.results[fault.index]["note"]:
                self.results[fault.index]["note"] = RUN_ENDED

    def _wait_turn(self, fault: ClusterFault) -> bool:
        """Until the fault's turn: its overlap after the previous injection, or its steps after every earlier heal."""
        if fault.overlap_s is not None:
            previous = self.results[fault.index - 1]
            while previous["injected_s"] is None or self.job.clock() < previous["injected_s"] + fault.overlap_s:
                if self.stopped.wait(POLL_S) or self.job.driver.state == "exited":
                    return False
            return True
        earlier = self.results[:fault.index]
        while any(r["injected_s"] is not None and r["ended_s"] is None for r in earlier):
            if self.stopped.wait(POLL_S) or self.job.driver.state == "exited":
                return False
        base = self.job.high
        while self.job.high < base + fault.after_steps or self.job.driver.state != "up":
            if self.stopped.wait(POLL_S) or self.job.driver.state in ("ending", "exited"):
                return self.job.driver.state != "exited" and not self.stopped.is_set()
        return True

    def _fire(self, fault: ClusterFault) -> None:
        result = self.results[fault.index]
        try:
            self._wait_running(fault)
            result["note"] = getattr(self, f"_{fault.kind}")(fault, result)
        except Exception as exc:  # noqa: BLE001 - recorded: a fault not carried out fails the run
            result["note"] = f"error: {exc!r}"[:300]
            self.errors.append(f"#{fault.index} {fault.kind}: {exc!r}"[:300])
        if result["injected_s"] is not None and result["ended_s"] is None:
            result["ended_s"] = round(self.job.clock(), 2)

    def _wait_running(self, fault: ClusterFault, timeout_s: float = 300.0) -> None:
        """A node fault waits for its container to run (one started again may be restarting: seed 3's packet loss
        found the learner's container between two failed `ray start`s)."""
        if fault.target not in ("rollout", "rollout2", "learner"):
            return
        deadline = time.monotonic() + timeout_s
        while self.cluster.state(fault.target) != "running":
            if time.monotonic() > deadline or self.stopped.wait(1.0):
                raise RuntimeError(f"{fault.target} is not running (waited {timeout_s:g} s)")

    def _inject(self, result: dict) -> None:
        result["injected_s"] = round(self.job.clock(), 2)
        print(f"[{result['injected_s']:8.1f}] fault #{result['index']} {result['kind']} {result['target']} "
              f"injected at step {self.job.high}", flush=True)

    def _heal(self, result: dict) -> None:
        result["ended_s"] = round(self.job.clock(), 2)
        print(f"[{result['ended_s']:8.1f}] fault #{result['index']} {result['kind']} {result['target']} healed at "
              f"step {self.job.high}", flush=True)

    def _hold(self, fault: ClusterFault) -> None:
        self.stopped.wait(fault.hold_s)

    # -- the kinds ----------------------------------------------------------------------------------------------

    def _node_kill(self, fault: ClusterFault, result: dict) -> str:
        self.cluster.docker("kill", fault.target)
        self._inject(result)
        self._hold(fault)
        self.cluster.docker("start", fault.target, check=False)  # its restart policy may have started it already
        self._heal(result)
        return f"docker kill, docker start after {fault.hold_s:g} s"

    def _node_pause(self, fault: ClusterFault, result: dict) -> str:
        self.cluster.docker("pause", fault.target)
        self._inject(result)
        self._hold(fault)
        self.cluster.docker("unpause", fault.target)
        self._heal(result)
        return f"docker pause {fault.hold_s:g} s ({fault.regime})"

    def _cut(self, fault: ClusterFault, result: dict, peers: list[str] | None, what: str) -> str:
        self.cluster.drop(fault.target, peers)
        self._inject(result)
        self._hold(fault)
        restarted = self.cluster.state(fault.target) != "running"
        self.cluster.heal(fault.target)
        self._heal(result)
        return f"cut from {what} {fault.hold_s:g} s ({fault.regime})" + (" (the node restarted)" if restarted else "")

    def _cut_redis(self, fault: ClusterFault, result: dict) -> str:
        return self._cut(fault, result, [self.cluster.ip("redis"), self.cluster.ip("proxy")], "Redis")

    def _cut_head(self, fault: ClusterFault, result: dict) -> str:
        return self._cut(fault, result, [self.cluster.ip("head")], "the head")

    def _cut_both(self, fault: ClusterFault, result: dict) -> str:
        return self._cut(fault, result, None, "everything")

    def _packet_loss(self, fault: ClusterFault, result: dict) -> str:
        self.cluster.drop(fault.target, None, probability=fault.level)
        self._inject(result)
        self._hold(fault)
        self.cluster.heal(fault.target)
        self._heal(result)
        return f"{fault.level:.0%} of its packets dropped for {fault.hold_s:g} s"

    def _latency(self, fault: ClusterFault, result: dict) -> str:
        self.cluster.delay(fault.target, fault.level)
        self._inject(result)
        self._hold(fault)
        self.cluster.delay(fault.target, 0)
        self._heal(result)
        return f"Redis traffic delayed {fault.level:g} ms each way for {fault.hold_s:g} s"

    def _redis_restart(self, fault: ClusterFault, result: dict) -> str:
        self.cluster.docker("kill", "redis")
        self._inject(result)
        self._hold(fault)
        self.cluster.docker("start", "redis", check=False)
        self._heal(result)
        return f"docker kill of Redis, docker start after {fault.hold_s:g} s"

    def _driver_kill(self, fault: ClusterFault, result: dict) -> str:
        deadline = time.monotonic() + 300
        while not checkpoint_complete(self.job.run_dir):  # a resume needs a checkpoint
            if time.monotonic() > deadline or self.stopped.wait(1.0):
                raise RuntimeError("no complete checkpoint to resume from within 300 s")
        pids = [pid for pid, args in self.cluster.top("head") if " train " in f" {args} " and "pcl" in args
                and "ray job" not in args]
        if not pids:
            raise RuntimeError("no pcl train process on the head")
        self.job.expect_resume()
        import os
        import signal

        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        self._inject(result)
        if not self.job.resubmitted.wait(RESUBMIT_WAIT_S):
            raise RuntimeError(f"the job was not resubmitted within {RESUBMIT_WAIT_S:g} s")
        self._heal(result)
        return f"SIGKILL of pcl train (pids {pids}), the job resubmitted with --resume"
