"""Carrying out a chaos run's fault schedule (`pcl.tools.chaos_schedule`) on a live run.

    injector = Injector(schedule, run)     # run: the ChaosRun (its process tree, driver, Redis, observations)
    injector.start(t0)                     # each fault in its own thread at t0 + at_s
    injector.stop(); injector.results      # one dict per fault: when it was injected and ended, in which phase

A fault aimed at a process waits for one to exist (a fault drawn during a restart strikes the new process); a
freeze stops a rollout worker's or verifier's process (SIGSTOP) for its drawn hold and continues it (SIGCONT; always,
even when the run ends first), or finds it gone: the run restarted it as stuck meanwhile. One
aimed at a phase (weight sync, checkpoint write) watches the run's processes and checkpoint directory every few
milliseconds from its time on and strikes while the phase lasts. What cannot be injected within WAIT_S is
reported as not injected, with the reason; a fault whose time (or target, or phase) had not come when the run
ended as "not injected (run ended)".
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

from entrypoints.chaos.procs import title_of
from pcl.tools.chaos_checks import MALFORMED_MARK
from pcl.tools.chaos_report import RUN_ENDED
from pcl.tools.chaos_schedule import CHECKPOINT_TITLES, WEIGHT_SYNC_TITLES, Fault, Schedule

WAIT_S = 300.0  # how long a fault waits for its target or phase
PHASE_POLL_S = 0.005  # a tiny model's weight sync or checkpoint write lasts tens of milliseconds
ACTOR_OF = {"kill_rollout": "RolloutWorker", "kill_verifier": "RewardVerifier", "kill_scorer": "ValueScorerActor",
            "kill_learner": "LearnerRank", "kill_coordinator": "Coordinator"}
MAX_FILL = 2**30  # a Redis with a larger maxmemory (or none) is not filled
TOP_UP_S = 0.25  # while Redis is held full, what the run frees is filled again this often
FILL_CHUNK = 64 * 1024  # bytes per filler value (small values: no large client buffer counted in Redis' memory)


class NotInjected(RuntimeError):
    """The fault could not be carried out (its target or phase did not come within WAIT_S, the run ended)."""


class Injector:
    def __init__(self, schedule: Schedule, run):
        self.schedule, self.run = schedule, run
        self.results: list[dict] = [{"index": f.index, "kind": f.kind, "scheduled_s": f.at_s, "injected_s": None,
                                     "note": RUN_ENDED} for f in schedule.faults]  # until it fires
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, t0: float) -> None:
        self.t0 = t0
        timer = threading.Thread(target=self._timer, name="chaos-faults", daemon=True)
        timer.start()
        self.threads.append(timer)

    def _timer(self) -> None:
        for fault in self.schedule.faults:
            if self.stopped.wait(max(0.0, self.t0 + fault.at_s - self.run.clock())):
                return
            thread = threading.Thread(target=self._fire, args=(fault,), name=f"chaos-fault-{fault.index}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        self.stopped.set()
        for thread in list(self.threads):
            thread.join(timeout=30)

    def _fire(self, fault: Fault) -> None:
        result = self.results[fault.index]
        try:
            note = getattr(self, f"_{fault.kind}", self._kill_actor)(fault, result)
            result["note"] = note
        except NotInjected as exc:
            result.update(injected_s=None, note=RUN_ENDED if self.stopped.is_set() else f"not injected: {exc}")
        except Exception as exc:  # noqa: BLE001 - a fault that broke is reported, the run goes on
            result["note"] = f"{'not injected' if result['injected_s'] is None else 'broke'}: {exc!r}"[:300]
        result.setdefault("ended_s", result["injected_s"])

    def _mark(self, result: dict) -> None:
        """The moment of injection, relative to t0, and the phase the run is in then."""
        result["phase"] = self.run.phase()
        result["injected_s"] = round(self.run.clock() - self.t0, 2)

    def _wait(self, what: str, find, timeout_s: float = WAIT_S, interval_s: float = 0.1):
        deadline = time.monotonic() + timeout_s
        while not self.stopped.is_set():
            found = find()
            if found:
                return found
            if time.monotonic() >= deadline:
                raise NotInjected(f"no {what} within {timeout_s:.0f} s")
            time.sleep(interval_s)
        raise NotInjected("the run ended first")

    def _sigkill(self, fault: Fault, result: dict, pids: list[int], what: str) -> str:
        pid = pids[fault.target % len(pids)]
        title = title_of(pid)
        self._mark(result)
        os.kill(pid, signal.SIGKILL)
        return f"{what} pid {pid} ({title[:60]})"

    # -- the kinds -------------------------------------------------------------------------------------------

    def _kill_actor(self, fault: Fault, result: dict) -> str:
        actor = ACTOR_OF[fault.kind]
        pids = self._wait(f"live {actor} process", lambda: self.run.tree.pids(actor))
        try:
            return self._sigkill(fault, result, pids, actor)
        except ProcessLookupError:  # gone since the last scan: the next one
            result["injected_s"] = None
            self.run.tree.scan()
            return self._kill_actor(fault, result)

    def _kill_driver(self, fault: Fault, result: dict) -> str:
        """Only once a checkpoint is complete (a resume needs one) and while the driver runs."""
        self._wait("complete checkpoint and running driver", lambda: self.run.has_checkpoint()
                   and self.run.driver.pid is not None and self.run.driver.state in ("up", "restarting"))
        self._mark(result)
        pid = self.run.driver.pid
        if not self.run.driver.kill():
            raise NotInjected("the driver had exited")
        return f"driver pid {pid}; resumed with --resume"

    def _redis_restart(self, fault: Fault, result: dict) -> str:
        pids = self._wait("running embedded Redis", self.run.redis_pids)
        return self._sigkill(fault, result, pids, "redis-server") + "; the driver restarts it"

    def _redis_full(self, fault: Fault, result: dict) -> str:
        """Fill Redis with filler keys until it refuses writes (its maxmemory) and keep it there for hold_s (what
        the run frees meanwhile, trimming its streams, is filled again every TOP_UP_S), then delete them."""
        client = self._wait("Redis to connect to", self.run.redis_client)
        cap = int(client.config_get("maxmemory")["maxmemory"])
        if not 0 < cap <= MAX_FILL:
            client.close()
            raise NotInjected(f"Redis' maxmemory is {cap} bytes: set redis.maxmemory_mb to a few tens of MB")
        keys: list[str] = []
        try:
            self._fill(client, keys, f"pcl-chaos:filler:{fault.index}")
            self._mark(result)
            until = time.monotonic() + fault.hold_s
            while time.monotonic() < until and not self.stopped.wait(min(TOP_UP_S, until - time.monotonic())):
                self._fill(client, keys, f"pcl-chaos:filler:{fault.index}")
        finally:
            client.close()
            freed = self._free(keys)
        result["ended_s"] = round(self.run.clock() - self.t0, 2)
        return f"filled to its {cap / 2**20:.0f} MB maxmemory, held {fault.hold_s:g} s" + freed

    @staticmethod
    def _fill(client, keys: list[str], prefix: str) -> None:
        """Write filler, 1 MB a round trip, until Redis refuses a write (or no longer answers: a restart)."""
        import redis

        while True:
            pipe = client.pipeline(transaction=False)
            batch = [f"{prefix}:{len(keys) + i}" for i in range(16)]
            for key in batch:
                pipe.set(key, b"f" * FILL_CHUNK)
            keys += batch  # those refused are deleted too: harmless
            try:
                pipe.execute()
            except (redis.OutOfMemoryError, redis.ConnectionError, redis.TimeoutError):
                return

    def _free(self, keys: list[str], timeout_s: float = 600.0) -> str:
        """Delete the filler, from whichever Redis the run has by then: one that restarted meanwhile (a revived
        server, a resumed driver's) loaded the filler from its AOF, and would otherwise stay full for good."""
        import redis

        deadline, tries = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline and not (self.stopped.is_set() and tries >= 3):
            client = self.run.redis_client()
            if client is not None:
                try:
                    for start in range(0, len(keys), 512):
                        client.delete(*keys[start:start + 512])
                    return "" if not tries else f"; freed after {tries} tries (Redis had restarted)"
                except redis.RedisError:
                    pass
                finally:
                    client.close()
            tries += 1
            time.sleep(1.0)
        return "; NOT freed: no Redis answered"

    def _malformed(self, fault: Fault, result: dict) -> str:
        """One entry into each work stream: a real entry's header with a corrupt body when the stream has one,
        else bytes that are no record at all; both carry MALFORMED_MARK, and each is counted in the stream's
        counts as injected (services/streams/counts.py), so that the counts still balance."""
        from services.streams.counts import inject
        from services.streams.topology import STREAMS, stream_key
        from services.streams.upkeep import PAYLOAD_FIELD

        client = self._wait("Redis to connect to", self.run.redis_client)
        rng, written = random.Random(fault.target), []
        self._mark(result)
        try:
            for stream in STREAMS:
                key = stream_key(self.run.name, stream.name)
                first = client.xrange(key, count=1)
                header = first[0][1].get(PAYLOAD_FIELD, b"")[:4] if first else b""
                payload = header + MALFORMED_MARK + f":{fault.index}:{stream.name}:".encode() + rng.randbytes(24)
                self._retry(lambda: inject(client, key, payload))  # counted as injected, beside the run's counts
                written.append(f"{stream.name} ({'header + corrupt body' if header else 'no record'})")
        finally:
            client.close()
        return "into " + ", ".join(written)

    def _retry(self, write, timeout_s: float = 60.0):
        """A write retried while Redis is full or restarting."""
        import redis

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return write()
            except (redis.OutOfMemoryError, redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() >= deadline or self.stopped.is_set():
                    raise
                time.sleep(0.5)

    def _freeze(self, fault: Fault, result: dict) -> str:
        """SIGSTOP of a rollout worker's or verifier's process, SIGCONT after the fault's hold."""
        pids = self._wait("live rollout worker or verifier process",
                          lambda: self.run.tree.pids("RolloutWorker") + self.run.tree.pids("RewardVerifier"))
        pid = pids[fault.target % len(pids)]
        title = title_of(pid)
        self._mark(result)
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:  # gone since the last scan: the next one
            result["injected_s"] = None
            self.run.tree.scan()
            return self._freeze(fault, result)
        try:
            self.stopped.wait(fault.hold_s)
        finally:
            result["ended_s"] = round(self.run.clock() - self.t0, 2)
            try:
                os.kill(pid, signal.SIGCONT)
                fate = "continued"
            except ProcessLookupError:
                fate = "gone when its hold ended (restarted as stuck)"
        return f"{title[:40]} pid {pid} stopped {fault.hold_s:g} s, {fate}"

    def _weight_sync(self, fault: Fault, result: dict) -> str:
        pids = self._phase(lambda titles: [pid for pid, t in titles.items() if t.startswith(WEIGHT_SYNC_TITLES)])
        return self._sigkill(fault, result, pids, "in a weight sync:")

    def _checkpoint_write(self, fault: Fault, result: dict) -> str:
        """During a write: one of the processes writing it (a learner rank, the scorer) or the coordinator."""
        def writers(titles: dict[int, str]) -> list[int]:
            if not (self.run.writing_checkpoint() or any(t.startswith(CHECKPOINT_TITLES) for t in titles.values())):
                return []
            return [pid for pid, t in titles.items() if t.startswith(CHECKPOINT_TITLES + ("ray::Coordinator",))]

        pids = self._phase(writers)
        return self._sigkill(fault, result, pids, "while a checkpoint was written:")

    def _phase(self, select) -> list[int]:
        """Watch the run's actor processes' titles every few milliseconds until `select(titles)` names some."""
        watched = ("LearnerRank", "RolloutWorker", "ValueScorerActor", "Coordinator")
        deadline = time.monotonic() + WAIT_S
        while not self.stopped.is_set() and time.monotonic() < deadline:
            pids = [pid for actor in watched for pid in self.run.tree.pids(actor)]  # the last scan's
            found = select({pid: title_of(pid) for pid in pids})
            if found:
                return found
            time.sleep(PHASE_POLL_S)
        raise NotInjected("the run ended first" if self.stopped.is_set()
                          else f"the phase did not come within {WAIT_S:.0f} s")


def checkpoint_complete(run_dir: Path) -> bool:
    root = run_dir / "checkpoints"
    return root.is_dir() and any((p / "COMPLETE").is_file() for p in root.glob("step-*"))
