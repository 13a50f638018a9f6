"""The processes of a chaos run: every process descended from this one (the `pcl train` drivers it starts, their
local Ray, Ray's actor processes, the embedded Redis, verifier and engine processes), found by their ancestry and
named by their titles (Ray names an actor's process `ray::Class`, or `ray::Class.method` while it runs one).

    tree = ProcessTree()            # this process becomes a subreaper: orphans of a killed driver stay its
    tree.scan()                     # every 0.5 s or so: records each process seen (pid and start time)
    tree.pids("RolloutWorker")      # live actor processes of a class
    tree.alive()                    # processes seen that still run: after the run, its leftovers

A subreaper (PR_SET_CHILD_SUBREAPER) receives the orphans of its descendants instead of init, so processes a
SIGKILLed driver leaves behind stay in this tree and are seen; the zombies it inherits are reaped here.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import time
from pathlib import Path

import psutil

PR_SET_CHILD_SUBREAPER = 36
RAY_TITLE = re.compile(r"^ray::(\w+)(?:\.(\w+))?")


def title_of(pid: int) -> str:
    """The process's title (its command line as it shows in ps), '' when it is gone."""
    try:
        raw = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def ray_class(title: str) -> str | None:
    match = RAY_TITLE.match(title)
    return match.group(1) if match else None


class ProcessTree:
    def __init__(self) -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
        except OSError:
            pass  # not Linux: orphans go to init and are seen only while their parents live
        self.seen: dict[tuple[int, float], str] = {}  # (pid, start time) -> title when first seen
        self.live: dict[int, str] = {}  # the last scan's descendants: pid -> title
        self.owned: set[int] = set()  # pids of children whose exit status a subprocess.Popen collects

    def forget(self) -> None:
        """Start a new record (another run: the reference)."""
        self.seen.clear()
        self.live.clear()

    def scan(self) -> dict[int, str]:
        """Every live descendant of this process, recorded; reaps the orphan zombies this process inherited."""
        children: dict[int, list[psutil.Process]] = {}
        for proc in psutil.process_iter(["ppid", "status"]):
            children.setdefault(proc.info["ppid"], []).append(proc)
        live, stack = {}, [os.getpid()]
        while stack:
            for proc in children.get(stack.pop(), []):
                stack.append(proc.pid)
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    self._reap(proc.pid)
                    continue
                try:
                    key = (proc.pid, proc.create_time())
                except psutil.Error:
                    continue
                title = title_of(proc.pid)
                live[proc.pid] = title
                if title:
                    self.seen[key] = title  # the latest title: the one it had when last seen
        self.live = live
        return live

    def _reap(self, pid: int) -> None:
        if pid in self.owned:
            return
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def pids(self, ray_class_name: str) -> list[int]:
        """Live processes of the last scan whose title is `ray::<class>` or `ray::<class>.<method>`."""
        return sorted(pid for pid, title in self.live.items() if ray_class(title) == ray_class_name)

    def redis_pids(self) -> list[int]:
        return sorted(pid for pid, title in self.live.items() if title.split(" ")[0].endswith("redis-server"))

    def alive(self) -> list[tuple[int, str]]:
        """Processes ever seen that still run (same pid and start time; zombies are gone), with their titles."""
        out = []
        for (pid, created), title in sorted(self.seen.items()):
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 1e-3 and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append((pid, title))
            except psutil.Error:
                continue
        return out

    def wait_gone(self, timeout_s: float) -> list[tuple[int, str]]:
        """Scan until no process seen still runs, or `timeout_s`; returns those left."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.scan()
            left = self.alive()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.5)

    def kill_all(self) -> None:
        """SIGKILL every process of this tree that still runs (the cleanup after a run: only its processes)."""
        self.scan()
        for pid, _ in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)
        self.scan()
