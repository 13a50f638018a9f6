"""glibc heap settings for processes that move stream entries of hundreds of kilobytes.

By default glibc serves an allocation of 128 KiB or more with its own mmap (raising that threshold to the
size of each such block freed), and gives the top of the heap back to the kernel as soon as 128 KiB, or
twice the raised threshold, is free there. A process that reads one group entry after another (16 samples
are ~250 KB), or that holds a step's batch (~130 MB of samples at m=512, n=16) and frees it when the step
commits, then keeps asking the kernel for fresh zeroed pages and faulting them in: on a 2-core VM that was
15-20% of the stream layer's CPU per sample, and a third of the bare transport's (docs/queues.md).

    keep_freed_heap()   # once per process, before the first entry; WorkQueue does it for its process

Blocks under MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of freed heap stays with the
process for the next entries and the next step. This never raises a process's memory above its own peak;
it only stops returning memory between steps that will need it again. Elsewhere than glibc (macOS, musl)
it does nothing, and `PCL_KEEP_FREED_HEAP=0` in the environment leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its moving threshold, fixed from the start
TRIM_THRESHOLD = 512 << 20  # above a paper-sized step's batch and the entries it was read from
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>
_applied: bool | None = None


def keep_freed_heap() -> bool:
    """Apply the settings to this process (once; later calls return the first answer). True where applied."""
    global _applied
    if _applied is None:
        _applied = False
        wanted = os.environ.get("PCL_KEEP_FREED_HEAP", "1") != "0"
        if wanted and platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                mallopt = ctypes.CDLL(None).mallopt
                _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
                    bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            except (OSError, AttributeError) as exc:  # no mallopt in this C library
                log.debug("heap settings not applied: %s", exc)
    return _applied
