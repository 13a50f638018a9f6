"""The `pcl train` child of a chaos run: started, SIGKILLed, resumed, and followed through its output.

    driver = Driver(config_files, overrides, run_dir, env, log_path, clock)
    driver.start()                 # pcl train CONFIG ... --run-dir RUN_DIR
    driver.kill()                  # SIGKILL of the driver process alone (what it started must stop by itself)
    driver.start(resume=True)      # pcl train ... --resume
    driver.state                   # starting, up, restarting, down, ending, exited

Its output (stdout and stderr, one stream) goes to `log_path` with the chaos clock's time on each line, and the
lines the driver prints at its milestones move `state` and add to `timeline`: the control plane listening, the
actors up (training starts), a failed run restarting from its checkpoint, a restored step, the end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

MILESTONES = (  # (pattern in a line of pcl train's output, what it means)
    (re.compile(r"^pcl: control plane at (\S+)"), "control"),
    (re.compile(r"^pcl: actors up in"), "up"),
    (re.compile(r"^pcl: the run failed \((.*)\); restarting from (\S+)"), "restarting"),
    (re.compile(r"^pcl: restored step (\d+)"), "restored"),
    (re.compile(r"^pcl: restart \d+ kept \d+ actors, started again: (.*)"), "started_again"),
    (re.compile(r"^pcl: the embedded Redis exited"), "redis_revived"),
    (re.compile(r"^pcl: done:"), "ending"),
)


class Driver:
    def __init__(self, command: list[str], run_dir: Path, env: dict[str, str], log_path: Path,
                 clock: Callable[[], float], on_start: Callable[[subprocess.Popen], None] | None = None,
                 tag: str = "chaos"):
        """`command`: the `pcl train` command line without --run-dir / --resume; `clock()`: seconds of the chaos
        run; `on_start(process)` is told of each new driver process; `tag` starts the log's own lines."""
        self.tag = tag
        self.command, self.run_dir, self.env, self.clock = command, run_dir, env, clock
        self.log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.on_start = on_start
        self.process: subprocess.Popen | None = None
        self.state = "exited"
        self.killed = False  # the current process was SIGKILLed by the chaos run
        self.starts = 0
        self.control_url: str | None = None
        self.timeline: list[tuple[str, float, int]] = []  # ("restored", t, step) and ("restart", t, 0)
        self.restarts = 0  # fleet restarts the drivers announced
        self.started_again: list[list[str]] = []  # the actors each restart from a checkpoint started again
        self.errors: list[str] = []  # why the run failed, as it printed it
        self.tail: deque[str] = deque(maxlen=12)  # its last lines
        self.lock = threading.Lock()

    def start(self, resume: bool = False) -> None:
        args = [*self.command, "--run-dir", str(self.run_dir)] + (["--resume"] if resume else [])
        self._note(f"{self.tag}: starting {' '.join(args[2:])}")
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=self.env, start_new_session=True, bufsize=1)
        self.state, self.killed, self.control_url = "starting", False, None
        self.starts += 1
        if self.on_start is not None:
            self.on_start(self.process)
        self.reader = threading.Thread(target=self._follow, args=(self.process,), name="chaos-driver-output",
                                       daemon=True)
        self.reader.start()

    def _follow(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self._note(line.rstrip("\n"))
            self.tail.append(line.rstrip("\n"))
            self._milestone(line.strip())
        process.stdout.close()

    def _note(self, line: str) -> None:
        with self.lock:
            self.log.write(f"[{self.clock():8.2f}] {line}\n")
            self.log.flush()

    def _milestone(self, line: str) -> None:
        for pattern, what in MILESTONES:
            match = pattern.match(line)
            if not match:
                continue
            now = self.clock()
            if what == "control":
                self.control_url = match.group(1)
            elif what == "up" and self.state != "down":
                self.state = "up"
            elif what == "restarting":
                self.state = "restarting"
                self.restarts += 1
                if match.group(2) == "the":  # "restarting from the start"
                    self.timeline.append(("restored", now, 0))
                self.errors.append(match.group(1))
            elif what == "restored":
                self.timeline.append(("restored", now, int(match.group(1))))
            elif what == "started_again":
                self.started_again.append(match.group(1).split(", "))
            elif what == "ending" and self.state != "down":
                self.state = "ending"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def kill(self) -> bool:
        """SIGKILL the driver process alone; False when none runs."""
        pid = self.pid
        if pid is None:
            return False
        self.killed, self.state = True, "down"
        os.kill(pid, signal.SIGKILL)
        self._note(f"{self.tag}: SIGKILL of the driver (pid {pid})")
        return True

    def poll(self) -> int | None:
        """The exit status once the current driver process has ended (its output read to the end), else None."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None:
            self.reader.join(timeout=10)  # its last lines read
            if self.state != "down":
                self.state = "exited"
        return code

    def stop(self) -> None:
        """End the driver's whole process group (a chaos run that gives up): down from now on, so that a request
        it cuts off counts as one the driver was down for."""
        if self.process is not None and self.process.poll() is None:
            self.state = "down"
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait(timeout=30)

    def close(self) -> None:
        self.log.close()


def train_command(config_files: list[str], overrides: list[str]) -> list[str]:
    """`pcl train` as a child process of this Python."""
    return [sys.executable, "-m", "entrypoints.cli", "train", *config_files, *overrides]


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True
