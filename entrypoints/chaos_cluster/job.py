"""The cluster chaos run's job and what the driving side sees of it: `pcl train` submitted to the cluster's head as a
Ray job (the submit-cpu service, as an operator submits it), resubmitted with `--resume` after its driver was killed;
the run directory (a bind mount, read from the host) watched for steps committed and restores; and the state the
control traffic (entrypoints/chaos/traffic.py) asks of it.

    job = ClusterJob(cluster, run_args, log_path)
    job.start()                      # submits, follows, resubmits with --resume when `job.expect_resume()` was said
    job.timeline                     # [("commit", t, step), ("restored", t, step)], t on job.clock()
    job.wait(timeout_s)              # True once the job ended with the run finished
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from pcl.loop.runlog import METRICS_FILE, read_metrics

WATCH_S = 0.5
RUN_DIR = "/runs/cluster-chaos"  # in the containers; CHAOS_RUNS_DIR/cluster-chaos on the host
PLACEMENT = ["rollout.resources={rollout: 1}", "verifier.resources={verifier: 1}",
             "learner.resources={learner: 1}", "value.resources={learner: 0.5}"]


class DriverState:
    """What the control traffic reads of the driver: its state and its control plane's URL."""

    def __init__(self, url: str):
        self.control_url, self.state = url, "starting"


class ClusterJob:
    def __init__(self, cluster, run_args: list[str], log_path: Path, steps: int):
        self.cluster, self.run_args, self.log_path, self.steps = cluster, run_args, log_path, steps
        self.run_dir = cluster.runs / Path(RUN_DIR).name
        self.started = time.monotonic()
        self.driver = DriverState(cluster.url("PCL_CONTROL_PORT"))
        self.timeline: list[tuple[str, float, int]] = []
        self.high = 0  # the last step committed
        self.submissions, self.finished, self.error = 0, False, None
        self.finished_at: float | None = None
        self.resubmitted = threading.Event()  # set at each resubmission (the driver kill's heal)
        self._resume_expected = threading.Event()
        self._done = threading.Event()
        self._process: subprocess.Popen | None = None

    # -- for the control traffic ------------------------------------------------------------------------------

    def clock(self) -> float:
        return time.monotonic() - self.started

    def control_up(self) -> bool:
        """Up from the first step a submission commits: before it, a request nobody answers is the driver's start."""
        return self.driver.state == "up"

    def phase(self) -> str:
        return {"up": "train", "down": "driver-down"}.get(self.driver.state, self.driver.state)

    # -- the job ----------------------------------------------------------------------------------------------

    def command(self, resume: bool) -> list[str]:
        return [*self.cluster.compose_args(), "run", "--rm", "-T", "submit-cpu", "train", "/opt/pcl/configs/tiny.yaml",
                "--run-dir", RUN_DIR, "control.host=0.0.0.0", *PLACEMENT, *self.run_args,
                *(["--resume"] if resume else [])]

    def start(self) -> None:
        threading.Thread(target=self._follow, name="chaos-job", daemon=True).start()
        threading.Thread(target=self._watch, name="chaos-watch", daemon=True).start()

    def expect_resume(self) -> None:
        """The driver is about to be killed: it counts as down from now (its control plane's connections are
        reset), and the job is resubmitted with --resume when it ends."""
        self.resubmitted.clear()
        self._resume_expected.set()
        self.driver.state = "down"

    def _follow(self) -> None:
        resume = False
        with open(self.log_path, "a", encoding="utf-8") as log:
            while True:
                self.submissions += 1
                self.driver.state = "starting"
                log.write(f"[{self.clock():8.1f}] submission {self.submissions}{' --resume' if resume else ''}\n")
                log.flush()
                if resume:
                    self.resubmitted.set()
                self._process = subprocess.Popen(self.command(resume), cwd=self.cluster_repo(), env=self.cluster.env,
                                                 stdout=log, stderr=subprocess.STDOUT)
                code = self._process.wait()
                log.write(f"[{self.clock():8.1f}] submission {self.submissions} exited {code}\n")
                log.flush()
                if self._resume_expected.is_set():
                    self._resume_expected.clear()
                    self.driver.state, resume = "down", True
                    continue
                self.driver.state = "exited"
                self.finished = code == 0 and self.high >= self.steps
                if not self.finished:
                    self.error = f"the job exited {code} at step {self.high} of {self.steps}"
                self.finished_at = self.clock()
                self._done.set()
                return

    def cluster_repo(self) -> str:
        from entrypoints.chaos_cluster.compose import REPO

        return str(REPO)

    def _watch(self) -> None:
        path = self.run_dir / METRICS_FILE
        while not self._done.is_set():
            steps = [int(r["step"]) for r in (read_metrics(path) if path.is_file() else []) if "effective_ratio" in r]
            last = steps[-1] if steps else 0
            now = self.clock()
            if last < self.high:
                self.timeline.append(("restored", now, last))
            for step in range(self.high + 1, last + 1) if last > self.high else ():
                self.timeline.append(("commit", now, step))
            if last != self.high:
                self.high = last
                if self.driver.state == "starting":
                    self.driver.state = "up"
                if last >= self.steps:
                    self.driver.state = "ending"
            self._done.wait(WATCH_S)

    def commits(self) -> list[float]:
        return sorted(t for what, t, _ in self.timeline if what == "commit")

    def wait(self, timeout_s: float) -> bool:
        self._done.wait(timeout_s)
        return self.finished

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
