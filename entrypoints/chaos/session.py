"""One run of `pcl train` under chaos: the driver child, the observer loop that follows it, the fault injector and
the control-plane traffic, until the run ends (or the chaos run gives up at its deadline).

    run = ChaosRun(command, run_dir, env, name, tree)
    run.go(schedule, token, deadline_s)      # returns when the run has ended
    run.timeline, run.injector.results, run.traffic.requests, run.finished, run.error

The observer polls every 0.1 s: the driver's exit (a driver the chaos run SIGKILLed is resumed with --resume,
anything else ends the run), new step records in metrics.jsonl (each a commit on the timeline), and every 0.5 s
the process tree. Training starts (t0, the schedule's zero) at the first "actors up" the driver prints.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil

from entrypoints.chaos.driver import Driver
from entrypoints.chaos.faults import Injector, checkpoint_complete
from entrypoints.chaos.procs import ProcessTree, title_of
from entrypoints.chaos.traffic import ControlTraffic
from pcl.loop.runlog import METRICS_FILE, iter_metrics
from pcl.tools.chaos_schedule import Observation, Schedule, phase_of

ACTORS = ("LearnerRank", "RolloutWorker", "ValueScorerActor", "Coordinator")
RESUME_AFTER_S = 1.0  # between a SIGKILLed driver's exit and its --resume


class ChaosRun:
    def __init__(self, command: list[str], run_dir: Path, env: dict[str, str], name: str, tree: ProcessTree):
        self.run_dir, self.name, self.tree = run_dir, name, tree
        self.requests_path = run_dir.parent / "requests.jsonl"  # the control traffic's record, beside the run
        self.started = time.monotonic()
        self.driver = Driver(command, run_dir, env, run_dir.parent / f"{run_dir.name}-driver.log", self.clock,
                             on_start=lambda process: tree.owned.add(process.pid))
        self.timeline: list[tuple[str, float, int]] = []  # ("commit", t, step), ("restored", t, step); t from t0
        self.t0: float | None = None
        self.injector: Injector | None = None
        self.traffic: ControlTraffic | None = None
        self.finished, self.error, self.resumes = False, None, 0
        self.finished_at: float | None = None
        self._records: set[tuple] = set()

    def clock(self) -> float:
        """Seconds since the chaos run started."""
        return time.monotonic() - self.started

    def since_t0(self, t: float) -> float:
        return round(t - (self.t0 or 0.0), 2)

    # -- what the injector and the traffic ask ---------------------------------------------------------------

    def control_up(self) -> bool:
        return self.driver.control_url is not None and self.driver.state in ("starting", "up", "restarting")

    def phase(self) -> str:
        titles = tuple(title_of(pid) for actor in ACTORS for pid in self.tree.pids(actor))
        status = self.traffic.last_status if self.traffic is not None else {}
        obs = Observation(self.driver.state, titles, self.writing_checkpoint(), status.get("state") == "paused",
                          int(status.get("step") or 0))
        return phase_of(obs)

    def writing_checkpoint(self) -> bool:
        """A checkpoint is being written: a `.tmp-step-NNNNNN-<pid>` directory whose writer (that pid) lives; one
        a killed writer left stays until the next checkpoint or driver start removes it."""
        try:
            names = os.listdir(self.run_dir / "checkpoints")
        except OSError:
            return False
        return any(name.startswith(".tmp-step-") and name.rsplit("-", 1)[-1].isdigit()
                   and psutil.pid_exists(int(name.rsplit("-", 1)[-1])) for name in names)

    def has_checkpoint(self) -> bool:
        return checkpoint_complete(self.run_dir)

    def redis_pids(self) -> list[int]:
        """The run's embedded Redis (the redis-server working in RUN_DIR/redis)."""
        home = str((self.run_dir / "redis").resolve())
        out = []
        for pid in self.tree.redis_pids():
            try:
                if psutil.Process(pid).cwd() == home:
                    out.append(pid)
            except psutil.Error:
                continue
        return out

    def redis_client(self):
        """A client of the run's Redis (its address from RUN_DIR/control.json), or None when it does not answer."""
        from services.redis_server import make_client

        try:
            url = json.loads((self.run_dir / "control.json").read_text())["redis_url"]
            client = make_client(url, socket_timeout=10)
            client.ping()
            return client
        except Exception:  # noqa: BLE001 - not up yet, or restarting: the caller waits
            return None

    # -- the observer ----------------------------------------------------------------------------------------

    def go(self, schedule: Schedule, token: str, deadline_s: float) -> None:
        self.injector = Injector(schedule, self)
        self.traffic = ControlTraffic(self, token, self.requests_path)
        self.driver.start()
        last_scan = 0.0
        try:
            while True:
                now = self.clock()
                if now - last_scan >= 0.5:
                    self.tree.scan()
                    last_scan = now
                self._watch_metrics(now)
                if self.t0 is None and self.driver.state == "up":
                    self.t0 = now
                    self.injector.start(now)
                    self.traffic.start(now, schedule.actions)
                if self._driver_ended(now):
                    return
                if now > deadline_s:
                    self.error = f"the run did not end within {deadline_s:.0f} s (the chaos run's deadline)"
                    self.driver.stop()
                    return
                time.sleep(0.1)
        finally:
            self.timeline += [(what, t, step) for what, t, step in self.driver.timeline]
            ordered = sorted(self.timeline, key=lambda e: e[1])
            self.timeline = [(what, self.since_t0(t), step) for what, t, step in ordered]
            self.injector.stop()
            self.traffic.stop()
            self.driver.close()

    def _watch_metrics(self, now: float) -> None:
        for record in iter_metrics(self.run_dir / METRICS_FILE):
            key = (record.get("step"), record.get("elapsed_seconds"), "effective_ratio" in record)
            if key[2] and key not in self._records:
                self._records.add(key)
                self.timeline.append(("commit", now, int(record["step"])))

    def _driver_ended(self, now: float) -> bool:
        code = self.driver.poll()
        if code is None:
            return False
        self.driver.process.wait()
        if self.driver.killed:
            time.sleep(RESUME_AFTER_S)
            self.resumes += 1
            self.driver.start(resume=True)
            return False
        self._watch_metrics(now)
        self.finished = code == 0
        self.finished_at = self.since_t0(now) if self.t0 is not None else None
        if not self.finished:
            self.error = f"pcl train exited with status {code}; its last lines:\n  " + "\n  ".join(self.driver.tail)
        return True
