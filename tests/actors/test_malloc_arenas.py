"""The driver's threads share a bounded number of glibc malloc arenas (actors/runtime.py, `limit_malloc_arenas`, called
as `pcl train` starts). By default glibc gives each thread that allocates while the others hold theirs an arena of its
own, up to 8 per core, and each keeps its high-water mark: the driver's RSS rose over the first hour of a soak by what
its 16 arenas (2 cores) held, from requests served by threads that come and go (docs/operations.md, "Long runs").

Each case runs in a child Python (arenas are a process's): 8 threads allocate at once, then glibc's malloc_stats
counts the arenas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THREADS = 8

ALLOCATE = rf"""
import ctypes, sys, threading
if sys.argv[1] == "limit":
    from actors.runtime import limit_malloc_arenas
    print(limit_malloc_arenas(), flush=True)
go = threading.Barrier({THREADS})

def allocate():
    go.wait()  # every thread allocates while the others hold their blocks
    blocks = [bytearray(4096) for _ in range(1000)]
    go.wait()

threads = [threading.Thread(target=allocate) for _ in range({THREADS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" paragraph per arena, on stderr
"""


def _arenas(case: str, arena_max: str | None = None) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env.update({"PYTHONPATH": str(REPO)}, **({"MALLOC_ARENA_MAX": arena_max} if arena_max else {}))
    done = subprocess.run([sys.executable, "-c", ALLOCATE, case], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines()), done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_the_driver_threads_share_at_most_two_malloc_arenas():
    from actors.runtime import DRIVER_MALLOC_ARENAS

    unlimited, _ = _arenas("plain")
    assert unlimited > DRIVER_MALLOC_ARENAS  # the probe sees glibc's arenas: one per thread by default
    limited, applied = _arenas("limit")
    assert applied == "True" and limited <= DRIVER_MALLOC_ARENAS, (unlimited, limited)
    chosen, applied = _arenas("limit", "4")  # a value in the environment wins
    assert applied == "False" and DRIVER_MALLOC_ARENAS < chosen <= 4
