"""Which process each long-lived actor of a run is, and when it was alive: the run's incarnation registry in Redis.

Every long-lived actor (the coordinator, the prompt sampler, V's scorer and its ranks, the learner ranks, the
rollout workers, the verifiers) beats a heartbeat from a thread of its own, naming its role ("rollout"), its
instance ("rollout-1": which of the role's actors it is, the same across its restarts), its incarnation (a fresh
id for each process start: `INCARNATION`) and where it runs (Ray node id, host name, process id). Actors are not
Ray-named, so nothing else stops two processes from acting as one instance at once: a node cut off from the head,
its actors started again elsewhere while the old ones still run. The registry fences them: the newest incarnation
of each instance is the only one whose beats are written, and an older one that beats again (thawed, reconnected)
is told so and ends itself (an actor's process exits), so the old and the new are never alive together. The
registry shows it: each incarnation's first
and last beat in the Redis server's clock (one clock for every node), and two incarnations of one instance whose
beats overlap in time were alive together (`pcl.tools.partition_checks.check_incarnations`).

    beat = Heartbeat(client, run, Identity("rollout", "rollout-1", node=node_id)).start()   # every BEAT_S
    beat = Heartbeat(client, run, identity, progress=service.progress).start()  # a worker's progress on each beat
    beat.stop()                                   # the actor ends: a last beat, marked ended
    beat.fenced.is_set()                          # a newer process of its instance registered: it beats no more
    read_incarnations(client, run)                # every incarnation the run had, first beat first
    live_incarnations(client, run)                # those that beat within LIVE_S and did not end

A serving worker's beat also carries its progress (`progress`: how long its serving loop has been in the pass under
way, `busy_s`, and how many samples that pass holds, `samples`): the coordinator reads it to tell a straggler (no
progress for its straggler timeout: its work is handed to the others) from a slow healthy pass
(`services/streams/stragglers.py`). A process that stopped (SIGSTOP, a frozen node) beats no more: its last beat ages.

One hash per run, pcl:{run}:incarnations, a few fields per incarnation ("{instance}|{incarnation}|info", "|first",
"|last", "|ended", "|progress"), written by one script per beat: it grows with the starts, not the beats. A fresh run clears it
(`clear_incarnations`); a restart or a resume keeps it, so the checks see every incarnation the run had. A beat
that fails (Redis restarting, unreachable or full) is skipped and the next one tries again: the heartbeat never
holds its actor up.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable

import redis

log = logging.getLogger(__name__)

INCARNATION = uuid.uuid4().hex[:12]  # this process's incarnation: a fresh id each time a process starts
BEAT_S = 1.0  # seconds between beats
LIVE_S = 5.0  # an incarnation whose last beat is older than this (and did not end) is not live

FENCED = -1  # the beat script's answer to a process a newer one of its instance has superseded

# One beat, in the server's clock (TIME): the identity and the first beat written once, the last beat every time.
# Fenced: each instance's newest incarnation is kept (KEYS[2]); a process whose instance has registered a newer one
# since its own first beat (it was frozen or cut off, and started again elsewhere) writes nothing and is told so.
_BEAT = """
local current = redis.call('HGET', KEYS[2], ARGV[5])
if current and current ~= ARGV[6] and redis.call('HEXISTS', KEYS[1], ARGV[1] .. '|first') == 1 then
  return -1
end
redis.call('HSET', KEYS[2], ARGV[5], ARGV[6])
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSETNX', KEYS[1], ARGV[1] .. '|info', ARGV[2])
redis.call('HSETNX', KEYS[1], ARGV[1] .. '|first', ms)
redis.call('HSET', KEYS[1], ARGV[1] .. '|last', ms)
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], ARGV[1] .. '|ended', ms) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], ARGV[1] .. '|progress', ARGV[4]) end
return ms
"""


def registry_key(run: str) -> str:
    return f"pcl:{run}:incarnations"


def current_key(run: str) -> str:
    """instance -> its newest incarnation (the one allowed to beat)."""
    return f"pcl:{run}:incarnations:current"


@dataclass(frozen=True)
class Identity:
    """One process acting as one instance of a role."""

    role: str  # coordinator, sampler, scorer, learner, rollout, verifier
    instance: str  # which of the role's actors: "rollout-1", "learner-0", "coordinator"; the same across restarts
    node: str = ""  # the Ray node id it runs on
    actor: str = ""  # its Ray actor's id (the same across Ray's restarts of it; "" outside Ray)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    incarnation: str = INCARNATION

    @property
    def field_prefix(self) -> str:
        return f"{self.instance}|{self.incarnation}"


@dataclass(frozen=True)
class Registry:
    """Where a run's actors register: its Redis and its name (given to each actor that beats)."""

    redis_url: str
    run: str


class Heartbeat:
    """An actor process's heartbeat in its run's registry, beaten every `every_s` from a daemon thread."""

    def __init__(self, client: redis.Redis, run: str, identity: Identity, every_s: float = BEAT_S,
                 progress: Callable[[], dict] | None = None, on_fenced: Callable[[], None] | None = None):
        """progress(): a serving worker's progress, written with each beat ({"busy_s", "samples"}). on_fenced():
        called once, from the beating thread, when a newer process of this instance has registered (this one was
        frozen or cut off and started again elsewhere): it beats no more (`fenced` is set); an actor ends itself
        (`actors.runtime.beat_with`)."""
        self.client, self.run, self.identity, self.every_s = client, run, identity, every_s
        self.progress, self.on_fenced = progress, on_fenced
        self.fenced = threading.Event()
        self.key = registry_key(run)
        self.info = json.dumps(asdict(self.identity), sort_keys=True)
        self.script = client.register_script(_BEAT)
        self.stopped = threading.Event()
        self.beats = 0  # beats written
        self.thread = threading.Thread(target=self._loop, name=f"pcl-heartbeat-{identity.instance}", daemon=True)

    def beat(self, ended: bool = False) -> int | None:
        """Write one beat; returns the server's time of it in ms, or None when it could not be written."""
        if self.fenced.is_set():
            return None
        progress = json.dumps(self.progress()) if self.progress is not None else ""
        ident = self.identity
        try:
            ms = int(self.script(keys=[self.key, current_key(self.run)],
                                 args=[ident.field_prefix, self.info, int(ended), progress, ident.instance,
                                       ident.incarnation]))
        except (redis.RedisError, OSError) as exc:  # restarting, unreachable or full: the next beat tries again
            log.debug("heartbeat of %s not written: %r", ident.instance, exc)
            return None
        if ms == FENCED:
            self.fenced.set()
            self.stopped.set()
            log.error("%s: a newer process of this instance has registered (this one was frozen or cut off and was "
                      "started again elsewhere): incarnation %s stops", ident.instance, ident.incarnation)
            if self.on_fenced is not None:
                self.on_fenced()
            return None
        self.beats += 1
        return ms

    def start(self) -> "Heartbeat":
        self.thread.start()
        return self

    def _loop(self) -> None:
        while True:
            self.beat()
            if self.stopped.wait(self.every_s):
                return

    def stop(self, wait_s: float = 5.0) -> None:
        """No more beats; a last one marks the incarnation ended (the actor stopped on purpose)."""
        self.stopped.set()
        if self.thread.ident is not None:
            self.thread.join(timeout=wait_s)
        self.beat(ended=True)


def read_incarnations(client: redis.Redis, run: str) -> list[dict]:
    """Every incarnation in the run's registry, first beat first: its identity (role, instance, incarnation, node,
    host, pid) with `first_ms`, `last_ms` and `ended_ms` (None unless it stopped on purpose), in the Redis server's
    clock, and `progress` (a serving worker's, at its last beat; None for the others)."""
    found: dict[str, dict] = {}
    for name, value in client.hgetall(registry_key(run)).items():
        prefix, _, part = (name.decode() if isinstance(name, bytes) else name).rpartition("|")
        entry = found.setdefault(prefix, {"first_ms": None, "last_ms": None, "ended_ms": None, "progress": None})
        if part == "info":
            entry.update(json.loads(value))
        elif part == "progress":
            entry["progress"] = json.loads(value)
        else:
            entry[f"{part}_ms"] = int(value)
    complete = [e for e in found.values() if "instance" in e and e["first_ms"] is not None]
    return sorted(complete, key=lambda e: (e["first_ms"], e["instance"]))


def live_incarnations(client: redis.Redis, run: str, live_s: float = LIVE_S) -> list[dict]:
    """The incarnations that beat within `live_s` of the server's clock now and did not end."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    return [e for e in read_incarnations(client, run)
            if e["ended_ms"] is None and now_ms - e["last_ms"] <= live_s * 1000]


def clear_incarnations(client: redis.Redis, run: str) -> None:
    """Forget the run's incarnations (a fresh run of that name)."""
    client.delete(registry_key(run), current_key(run))
