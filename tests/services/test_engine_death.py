"""A dead engine is a dead worker, and no engine process outlives its worker.

- The rollout serving loop (real HF engine, real Redis) meets an engine that died (vLLM's EngineDeadError): it
  hands the requests back, calls its fatal hook once and ends, instead of retrying the batch forever.
- `end_process` (what that hook is in the actor) ends the process and the processes it started (vLLM's engine
  core on GPU) with an exit code Ray restarts on; real processes.
- A worker killed outright leaves its engine's processes behind: its next incarnation ends them
  (`reap_engine_processes`) before it builds its engine; real processes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from actors.engine_processes import EXIT_CODE
from pcl.engines.base import engine_dead
from pcl.engines.hf import HFEngine
from pcl.engines import RolloutRequest, SamplingParams
from services.streams.payloads import RequestRecord
from services.streams.topology import open_queue
from services.streams.workers import RolloutService, serve_forever


class EngineDeadError(RuntimeError):
    """vLLM's (vllm.v1.engine.exceptions.EngineDeadError), recognised by its name."""


class DiesOnGenerate:
    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, params):
        raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")


@pytest.mark.redis
def test_a_dead_engine_ends_the_serving_loop_and_hands_its_requests_back(redis_client, key_prefix, tiny_model_dir):
    opts = dict(visibility_timeout_s=30.0, block_ms=50)
    requests = open_queue(redis_client, key_prefix, "rollout_requests", "w0", **opts)
    results = open_queue(redis_client, key_prefix, "rollout_results", "w0", **opts)
    engine = DiesOnGenerate(HFEngine(str(tiny_model_dir), device="cpu", seed=0, num_threads=1))
    service = RolloutService(engine, requests, results, worker="rollout-0")
    sampling = SamplingParams(n=2, max_new_tokens=4)
    requests.put([[RequestRecord.of(key_prefix, 0, 0, RolloutRequest(f"p{i}", (5, 6, 7), sampling)) for i in range(3)]])
    fatal_calls, stop = [], threading.Event()
    loop = threading.Thread(target=serve_forever, args=(service, stop, "rollout-0"),
                            kwargs={"fatal": engine_dead, "on_fatal": fatal_calls.append})
    loop.start()
    loop.join(timeout=30)
    assert not loop.is_alive() and stop.is_set()
    assert len(fatal_calls) == 1 and engine_dead(fatal_calls[0])
    # The chunk is handed back at once: another worker takes it now, not after the visibility timeout.
    other = open_queue(redis_client, key_prefix, "rollout_requests", "w1", **opts)
    [delivery] = other.take(10, block_ms=100)
    assert [r.prompt_id for r in delivery.records] == ["p0", "p1", "p2"] and delivery.deliveries == 2


PARENT = """
import subprocess, sys, time
from actors.engine_processes import end_process, record_engine_processes
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
record_engine_processes({run!r}, "rollout-0")
print("recorded", flush=True)
if {end!r}:
    end_process(RuntimeError("EngineDeadError"))
time.sleep(600)
"""


def start_parent(tmp_path, run: str, end: bool) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(run=run, end=end)], stdout=subprocess.PIPE,
                              text=True, cwd=str(Path(__file__).resolve().parents[2]))
    return parent, int(parent.stdout.readline())


def gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_end_process_takes_the_engine_processes_with_it(tmp_path, key_prefix):
    parent, child = start_parent(tmp_path, key_prefix, end=True)
    assert parent.wait(timeout=30) == EXIT_CODE
    assert gone(child)


def test_a_restarted_worker_ends_the_engine_processes_its_killed_predecessor_left(tmp_path, key_prefix):
    from actors.engine_processes import reap_engine_processes

    parent, child = start_parent(tmp_path, key_prefix, end=False)
    assert parent.stdout.readline() == "recorded\n"  # the record is written
    parent.kill()  # as Ray kills an actor: SIGKILL, its children stay
    parent.wait(timeout=10)
    assert psutil.pid_exists(child) and not gone(child, 0.5)  # an orphan, holding what it held
    assert reap_engine_processes(key_prefix, "rollout-0") == [child]
    assert gone(child)
    assert reap_engine_processes(key_prefix, "rollout-0") == []  # once
