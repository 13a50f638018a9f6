"""The heap settings of processes that move stream entries (services/streams/heap.py), observed through glibc's own
counters in a fresh process each: entry-sized blocks come from the heap, and freed heap stays for reuse."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Allocates 400 blocks of 250 KB (a group entry's size), frees them, and reports glibc's counters: hblks is
# the number of blocks served by mmap, arena the bytes of heap the process holds.
PROBE = """
import ctypes, json
from services.streams.heap import keep_freed_heap
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
applied = keep_freed_heap()
before = libc.mallinfo2()
blocks = [bytes(250_000) for _ in range(400)]
held = libc.mallinfo2()
del blocks
after = libc.mallinfo2()
print(json.dumps({"applied": applied, "again": keep_freed_heap(), "mmapped": held.hblks - before.hblks,
                  "heap_held": held.arena, "heap_after_free": after.arena}))
"""


def probe(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env={**os.environ, **env}, check=True,
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's (mallopt); elsewhere nothing is applied")
def test_entry_sized_blocks_come_from_the_heap_and_freed_heap_is_kept():
    tuned = probe(PCL_KEEP_FREED_HEAP="1")
    assert tuned["applied"] and tuned["again"]
    assert tuned["mmapped"] == 0  # all 400 blocks from the heap, none from a fresh mmap
    assert tuned["heap_held"] >= 100_000_000 and tuned["heap_after_free"] >= 100_000_000  # kept for reuse
    default = probe(PCL_KEEP_FREED_HEAP="0")  # glibc's defaults, the control
    assert not default["applied"]
    assert default["mmapped"] == 400  # each block its own mmap, unmapped (page faults again) when freed
    assert default["heap_after_free"] < 10_000_000

