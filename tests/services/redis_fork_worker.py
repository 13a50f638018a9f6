"""A driver-like process for tests/services/test_redis_server.py: it holds a gloo process group (threads, sockets)
and a hook that runs whenever Python code runs in a forked child; it starts the embedded Redis from its main
thread, lets the keeper's thread start it again after a SIGKILL, starts a second one from the main thread, checks
that a server revived from a short-lived thread ends with that thread, writes what it saw to a JSON file, and
waits to be killed.

    python -m tests.services.redis_fork_worker DIR      # writes DIR/ready.json; DIR/forked-child-ran-python
                                                        # exists if any child ran Python between fork and exec
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def main(work: Path) -> None:
    import torch
    import torch.distributed as dist

    from services.redis_keeper import EmbeddedRedisKeeper
    from services.redis_server import ping, start_embedded

    dist.init_process_group("gloo", init_method=f"file://{work / 'store'}", rank=0, world_size=1)
    dist.all_reduce(torch.ones(1))  # the group's threads and connections are live
    marker = work / "forked-child-ran-python"
    os.register_at_fork(after_in_child=lambda: marker.write_text("Python ran between fork and exec\n"))

    handle = start_embedded(work / "redis", appendonly=True, maxmemory_mb=32)  # from the main thread
    handle.client().set("k", b"v")
    first = handle.pid
    keep = EmbeddedRedisKeeper(handle, limit=3).watch(interval_s=0.1)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while keep.restarts == 0 or not ping(handle.url):  # the keeper's thread starts it again
        if keep.error is not None or time.monotonic() > deadline:
            raise SystemExit(f"the keeper's thread did not start Redis again: {keep.error}")
        time.sleep(0.05)

    # A server revived from a thread with die_with_thread ends when that thread ends.
    brief = start_embedded(work / "brief", appendonly=False)
    brief._stop(kill=True)
    thread = threading.Thread(target=brief.revive, kwargs={"die_with_thread": True})
    thread.start()
    thread.join()
    brief_pid = brief.pid
    try:
        brief._process.wait(timeout=60)
        brief_ended = True
    except subprocess.TimeoutExpired:
        brief_ended = False

    other = start_embedded(work / "other", appendonly=False)  # from the main thread
    client = handle.client()
    (work / "ready.tmp").write_text(json.dumps({
        "first": first, "revived": handle.pid, "tcp_url": handle.tcp_url, "value": client.get("k").decode(),
        "maxmemory": int(client.config_get("maxmemory")["maxmemory"]),
        "brief": brief_pid, "brief_ended": brief_ended, "other": other.pid,
    }))
    (work / "ready.tmp").rename(work / "ready.json")  # whole, or not there
    signal.pause()  # until the test kills this process: no atexit, no close(), only the kernel stops Redis


if __name__ == "__main__":
    main(Path(sys.argv[1]))
