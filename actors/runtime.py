"""Process set-up shared by the actors (torch thread counts and quiet logging, the heartbeat naming the actor's role,
instance, incarnation and node: `heartbeat`), and Ray's start-up for every driver (`pcl train`, `pcl experiment`,
the benches, the tests): `start_ray()` connects to RAY_ADDRESS or starts a local Ray; `pcl train`'s malloc arenas
capped (`limit_malloc_arenas`).

On the embedded default many actors share two cores, so each pins torch to a small thread pool; on a GPU
node the count comes from the actor's CPU reservation instead.
"""

from __future__ import annotations

import logging
import os
import threading


def init_actor_process(threads: int = 1) -> None:
    """Pin torch's intra-op threads (before any heavy work) and keep library logging terse."""
    import torch

    torch.set_num_threads(max(1, threads))
    quiet_libraries()


def quiet_libraries() -> None:
    """Library logging terse and no loading bars (an actor's, or `pcl train --local`'s process)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("transformers", "ray", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a hard dependency
        pass


def heartbeat(registry, role: str, instance: str):
    """Start this actor process's heartbeat in its run's incarnation registry (`services.incarnations.Registry`: the
    run's Redis and name), naming the Ray node it runs on; None without a registry (an actor started outside a run)."""
    if registry is None:
        return None
    from services.redis_server import make_client

    return beat_with(make_client(registry.redis_url, f"heartbeat-{instance}"), registry.run, role, instance)


def beat_with(client, run: str, role: str, instance: str, progress=None):
    """`heartbeat` on a Redis client the actor already has; `progress()`, a serving worker's, goes with each beat."""
    import ray

    from services.incarnations import Heartbeat, Identity

    node = actor = ""
    if ray.is_initialized():
        context = ray.get_runtime_context()
        node, actor = context.get_node_id(), context.get_actor_id() or ""
    return Heartbeat(client, run, Identity(role, instance, node, actor), progress=progress,
                     on_fenced=end_superseded_process if actor else None).start()


FENCED_EXIT = 75  # the exit status of an actor process a newer process of its instance superseded


def end_superseded_process() -> None:
    """A newer process of this actor's instance has registered: this one was frozen or cut off from the head, and
    Ray started the actor again elsewhere. It must not act as that actor any more (write results, acknowledge
    entries, train): it exits at once; what it held is reclaimed from the work streams by the others."""
    import os
    import sys

    sys.stderr.flush()
    os._exit(FENCED_EXIT)


def serving_heartbeat(service, name: str):
    """The heartbeat of a worker actor that serves a stream (`ServingThread`): its role and instance from `name`
    ("rollout-1"), its run and Redis from the stream its loop takes from (a rollout worker's requests, a
    verifier's results), and its serving loop's progress (services/streams/stragglers.py reads it)."""
    from services.streams.topology import run_of

    taken = getattr(service, "requests", None) or service.results
    return beat_with(taken.client, run_of(taken.stream), name.rsplit("-", 1)[0], name, progress=service.progress)


# Ray's own growth over a run of days, bounded where this process starts a local Ray (a cluster's nodes take these
# from their own environment: docs/operations.md, "Long runs"); a value already in the environment wins.
# - task events the GCS keeps for the state API and the dashboard (Ray's default: 100,000 tasks, about as many as
#   a few thousand steps of the tiny run make; the GCS server's memory grows with them until then);
# - the task attempts the GCS has evicted from those events, which it remembers (per job, so one set for the whole
#   run) to drop their late events: one an actor call once the events are full (about 16 a step), up to Ray's
#   default of 1,000,000 (400,000 actor calls: the GCS server 91.7 -> 118.5 MB; 91.0 -> 97.3 MB with this bound);
# - every log file rotated at RAY_ROTATION_MAX_BYTES, RAY_ROTATION_BACKUP_COUNT old files kept (Ray's defaults,
#   512 MB and 5, allow 3 GB per file; a worker's .out/.err rotate only when RAY_ROTATION_MAX_BYTES is set).
# Not RAY_event_stats_print_interval_ms=-1, which Ray documents as "off": on Ray 2.60 the GCS server then writes
# its state dump without pause (64 MB of gcs_server.out a few minutes, most of a core).
RAY_LIMITS = {"RAY_task_events_max_num_task_in_gcs": "10000",
              "RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs": "10000",
              "RAY_ROTATION_MAX_BYTES": str(64 << 20), "RAY_ROTATION_BACKUP_COUNT": "2"}


# glibc's malloc arenas in the driver. By default a thread that allocates while the others hold theirs gets an arena
# of its own, up to 8 per core, and each keeps the high-water mark of what its threads held: the driver's threads come
# and go (the control plane's, Ray's, the trackers'), and its RSS rose through a soak's first hour by what its 16
# arenas on 2 cores held (docs/operations.md, "Long runs"; a 64-core head node allows 512). Two arenas bound that; the
# driver allocates little, so the threads hardly wait on each other.
DRIVER_MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = DRIVER_MALLOC_ARENAS) -> bool:
    """Cap this process's malloc arenas at `arenas` (glibc's M_ARENA_MAX), for threads that start allocating from now
    on; MALLOC_ARENA_MAX in the environment wins (glibc read it at start). Returns whether the cap was set (False:
    set by the environment, or not glibc)."""
    import ctypes

    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS has no mallopt)
        return False
    return mallopt(-8, arenas) == 1  # -8: M_ARENA_MAX; 1: done


def start_ray(settings=None) -> bool:
    """Connect to the cluster in RAY_ADDRESS, or start a local Ray (its growth bounded: RAY_LIMITS; its health checks
    and head timeout from `settings`, the run config's `ray` section, Ray's defaults when None); returns whether we
    started it. A cluster's nodes take those from their own environment (`RayConfig.ray_start_env`)."""
    import ray

    from pcl.config_ray import RayConfig

    if ray.is_initialized():
        return False
    # Actors inherit a quiet, single-threaded environment: many of them share the cores of a small machine.
    env = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false"}
    quiet = {"logging_level": logging.ERROR, "log_to_driver": True, "include_dashboard": False,
             "runtime_env": {"env_vars": env}}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **{k: v for k, v in quiet.items() if k != "include_dashboard"})
        return False
    for key, value in RAY_LIMITS.items():  # read by Ray's processes as they start, workers included
        os.environ.setdefault(key, value)
    ray.init(num_cpus=max(2, os.cpu_count() or 2), _system_config=(settings or RayConfig()).system_config(), **quiet)
    return True


def in_bundle(placement_group, index: int) -> dict:
    """Actor options placing it in bundle `index` of `placement_group` ({} when None: placed by resources)."""
    if placement_group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=placement_group,
                                                                    placement_group_bundle_index=index)}


def gather(refs: list, timeout_s: float, what: str) -> list:
    """`ray.get(refs)` that fails as soon as any one of them fails, rather than after the others finish (a
    collective whose peer died never does) or time out; raises TimeoutError naming `what` after timeout_s."""
    import time

    import ray

    pending, deadline = list(refs), time.monotonic() + timeout_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what}: {len(pending)} of {len(refs)} calls unanswered after {timeout_s:g}s")
        ready, pending = ray.wait(pending, num_returns=1, timeout=min(left, 1.0))
        ray.get(ready)  # raises the first failure at once
    return ray.get(list(refs))


def gather_answered(refs: list, timeout_s: float, what: str, laggard_s) -> list[bool]:
    """`gather` that does not wait for laggards: once some calls answered, the others get `laggard_s(seconds the
    slowest answer took)` more, and those still unanswered then are left (False; their calls stay queued on their
    actors). Any failure raises at once; TimeoutError naming `what` when none answered within timeout_s."""
    import time

    import ray

    start = time.monotonic()
    index = {ref: i for i, ref in enumerate(refs)}
    pending, answered = list(refs), {}
    while pending:
        now = time.monotonic()
        if answered and now - start >= laggard_s(max(answered.values())):
            break
        if now - start >= timeout_s:
            raise TimeoutError(f"{what}: {len(pending)} of {len(refs)} calls unanswered after {timeout_s:g}s")
        ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for ref in ready:
            ray.get(ref)  # raises the first failure at once
            answered[index[ref]] = time.monotonic() - start
    return [i in answered for i in range(len(refs))]


class ServingThread:
    """A worker actor's serving loop (`services.streams.workers.serve_forever`) in a daemon thread, which can be
    stopped and made anew: `quiesce` stops it (the pass under way ends first) and readies a new, unstarted one that
    `start` starts (a restart of the run from a checkpoint that keeps the actor)."""

    def __init__(self, service, name: str, **kwargs):
        self.service, self.name, self.kwargs = service, name, kwargs
        self._renew()
        self.heartbeat = serving_heartbeat(service, name)  # from here to `shutdown`

    def _renew(self) -> None:
        from services.streams.workers import serve_forever

        self.stop = threading.Event()
        self.thread = threading.Thread(target=serve_forever, args=(self.service, self.stop, self.name),
                                       kwargs=self.kwargs, daemon=True)

    @property
    def started(self) -> bool:
        return self.thread.ident is not None

    def alive(self) -> bool:
        return self.thread.is_alive()

    def start(self) -> None:
        """Start serving, if not serving yet (and not stopped)."""
        if not self.started and not self.stop.is_set():
            self.thread.start()

    def quiesce(self, wait_s: float) -> bool:
        """Stop serving and ready a new loop; False if the running one did not stop within wait_s."""
        self.stop.set()
        if self.started:
            self.thread.join(timeout=wait_s)
            if self.thread.is_alive():
                return False
        self._renew()
        return True

    def shutdown(self, wait_s: float = 10.0) -> None:
        self.stop.set()
        if self.started:
            self.thread.join(timeout=wait_s)
        self.heartbeat.stop()
