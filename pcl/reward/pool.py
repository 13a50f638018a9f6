"""Reward scoring in spawned worker processes with a hard per-sample timeout (docs/architecture.md).

    with RewardPool(processes=2, timeout_s=5.0) as pool:
        outcomes = pool.score_batch([(response, gold), ...])   # one RewardOutcome per pair, in order
        rewards = [outcome.reward for outcome in outcomes]

sympy can spin or allocate without bound on a hostile model output (an exponent tower, a megabyte of
unclosed braces), and math-verify's own alarm only works on a main thread, so scoring runs in worker
processes that can be killed. A dispatcher thread owns the workers: it sends each idle worker a chunk of
samples (one message, to cut IPC), gets one result message per sample back, and so always knows when the
worker's current sample started. A sample that runs past `timeout_s` scores 0 with `timed_out=True`; a
worker that dies (os._exit, a C-level abort, the memory cap) scores its current sample 0 with an `error`.
Either way the worker is killed, reaped and replaced, and the rest of its chunk goes back to the queue
front. A worker that reports an error (MemoryError, RecursionError: a worker at its memory cap fails every
sample it gets) is replaced too, and the sample is scored once more by another worker: only a sample that
fails there as well scores 0 with its `error`. Workers are also recycled (stopped politely, replaced) after
`max_tasks_per_worker` samples, so no slow leak (sympy's caches, a fragmented heap) accumulates.
`concurrent.futures.ProcessPoolExecutor` cannot do this: it cannot cancel a running task, and a dead worker
breaks the whole executor. A boxed plain number (or a response that is one, "42") against plain-number golds
never reaches a worker: `pcl.reward.verdict.numbers_verdict` settles it in the calling thread, in linear time and
without sympy, which is cheaper than the round trip.

`score` and `score_batch` may be called from any thread, several at once.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from pcl.reward.verdict import normalize_gold, numbers_verdict, score_answer

__all__ = ["RewardOutcome", "RewardPool"]

log = logging.getLogger(__name__)

ScoreFn = Callable[[Any, tuple[str, ...]], float]  # (response, normalised gold alternatives) -> reward
STARTUP_TIMEOUT_S = 120.0  # a new worker imports sympy and math-verify; slow on a loaded 2-core machine
MAX_STARTUP_FAILURES = 3  # consecutive workers dying before ready: the pool is broken, not the input
# Longest response whose plain-number verdict is taken in the calling thread (the brace scan is linear,
# ~20 ms here at this size); longer ones go to a worker, under the timeout. Real responses are far shorter.
CALLER_MAX_CHARS = 65536


@dataclass(frozen=True)
class RewardOutcome:
    """The verdict on one (response, gold) pair."""

    reward: float  # 1.0 or 0.0 for the math reward; 0.0 on timeout or error
    seconds: float  # time the worker spent on this sample (until the kill, for a timeout)
    timed_out: bool = False  # ran past the pool's timeout_s; the worker was killed and replaced
    error: str | None = None  # why the sample could not be scored (an exception, a dead worker)


def math_score(response: Any, golds: tuple[str, ...]) -> float:
    """The default worker score function: `pcl.reward.verdict.math_reward` with math-verify's alarm disabled."""
    return score_answer(response, golds, guard_s=None)  # the pool's kill is the timeout


@dataclass
class _Job:
    response: Any
    golds: tuple[str, ...]
    future: Future
    attempts: int = 0  # times a worker reported an error on it (it is retried once, by another worker)


def _settled_by_numbers(response: Any, golds: tuple[str, ...]) -> RewardOutcome | None:
    """The outcome when plain numbers decide it, scored in the calling thread; None when a worker must."""
    if not isinstance(response, str) or len(response) > CALLER_MAX_CHARS:
        return None
    start = time.perf_counter()
    try:
        verdict = numbers_verdict(response, golds)
    except Exception:  # not expected; a worker then scores it under the timeout
        return None
    return None if verdict is None else RewardOutcome(verdict, time.perf_counter() - start)


class _Worker:
    """One spawned scoring process and what the dispatcher knows about it."""

    def __init__(self, context: Any, score_fn: ScoreFn, memory_limit_mb: int | None) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(
            target=_worker_main, args=(child_conn, score_fn, memory_limit_mb), name="reward-worker",
            daemon=True,
        )
        self.process.start()
        child_conn.close()  # the child holds its end; EOF on ours then means the child is gone
        self.ready = False
        self.started_at = time.monotonic()
        self.chunk: deque[_Job] = deque()  # sent and not yet answered, in the order the worker runs them
        self.sample_started = 0.0  # when the worker began chunk[0]
        self.tasks = 0  # samples it has answered

    def stop(self, kill: bool, grace_s: float = 2.0) -> None:
        """Ends and reaps the process (no zombie): politely unless `kill`, by SIGKILL otherwise."""
        if not kill:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class RewardPool:
    """`processes` spawned workers scoring (response, gold) pairs with a hard `timeout_s` per sample."""

    def __init__(
        self,
        processes: int = 2,
        timeout_s: float = 5.0,
        *,
        chunk_size: int = 16,
        memory_limit_mb: int | None = 2048,
        score_fn: ScoreFn = math_score,
        max_tasks_per_worker: int | None = 10000,
    ) -> None:
        if not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be a positive int, got {processes!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size!r}")
        if max_tasks_per_worker is not None and max_tasks_per_worker < 1:
            raise ValueError(f"max_tasks_per_worker must be None or positive, got {max_tasks_per_worker!r}")
        if memory_limit_mb is not None and memory_limit_mb < 256:
            raise ValueError(f"memory_limit_mb must be None or at least 256, got {memory_limit_mb!r}")
        self.processes, self.timeout_s, self.chunk_size = processes, float(timeout_s), chunk_size
        self.max_tasks_per_worker = max_tasks_per_worker
        self._stats: Counter[str] = Counter()  # workers replaced (by cause) and recycled, errors returned
        # Plain-number answers against plain-number golds are settled here, in linear time without sympy:
        # most math answers, and shipping them to a worker would cost more than scoring them.
        self._numbers_in_caller = score_fn is math_score
        self._spawn = lambda: _Worker(multiprocessing.get_context("spawn"), score_fn, memory_limit_mb)
        self._lock = threading.Lock()
        self._pending: deque[_Job] = deque()
        self._closed = False
        self._broken: str | None = None
        self._startup_failures = 0
        self._wake_recv, self._wake_send = socket.socketpair()
        self._wake_send.setblocking(False)
        self._workers = [self._spawn() for _ in range(processes)]
        self._dispatcher = threading.Thread(target=self._dispatch, name="reward-pool", daemon=True)
        self._dispatcher.start()

    # ----- public API -----

    def score(self, response: Any, gold: Any) -> RewardOutcome:
        """Scores one pair; blocks until it is scored, timed out or failed."""
        return self.score_batch([(response, gold)])[0]

    def score_batch(self, pairs: Iterable[tuple[Any, Any]]) -> list[RewardOutcome]:
        """Scores (response, gold) pairs on all workers; outcomes in input order. Bad golds raise first."""
        checked = []
        for index, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"pairs[{index}] must be a (response, gold) pair, got {pair!r:.80}")
            try:
                checked.append((pair[0], normalize_gold(pair[1])))
            except (TypeError, ValueError) as error:
                raise type(error)(f"pairs[{index}]: {error}") from None
        if self._closed or self._broken:
            raise RuntimeError(self._broken or "RewardPool is closed")
        settled = [_settled_by_numbers(*pair) if self._numbers_in_caller else None for pair in checked]
        jobs = [_Job(*pair, Future()) for pair, outcome in zip(checked, settled) if outcome is None]
        with self._lock:
            if self._closed or self._broken:
                raise RuntimeError(self._broken or "RewardPool is closed")
            self._pending.extend(jobs)
            self._stats["settled_in_caller"] += len(settled) - len(jobs)
        self._wake()
        from_workers = iter([job.future.result() for job in jobs])
        return [outcome if outcome is not None else next(from_workers) for outcome in settled]

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> bool:
        """Blocks until every worker has started (imports done, grammar loaded); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not all(worker.ready for worker in list(self._workers)):
            if self._closed or self._broken or time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (they change as stuck or dead workers are replaced)."""
        return [worker.process.pid for worker in list(self._workers)]

    def stats(self) -> dict[str, int]:
        """Counts since the pool started: workers `recycled` after max_tasks_per_worker, workers replaced after
        an error (`replaced_after_error`), a timeout or their death, samples returned with an `errors`, and
        samples plain numbers settled in the calling thread (`settled_in_caller`), which no worker saw."""
        keys = ("recycled", "replaced_after_error", "replaced_after_timeout", "replaced_after_death", "errors",
                "settled_in_caller")
        return {key: int(self._stats[key]) for key in keys}

    def close(self) -> None:
        """Stops and reaps every worker; samples still waiting fail with RuntimeError. Idempotent."""
        with self._lock:
            self._closed = True
        self._wake()
        self._dispatcher.join()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----- the dispatcher thread -----

    def _dispatch(self) -> None:
        try:
            while not self._closed:
                self._assign_work()
                ready = wait([self._wake_recv] + [w.conn for w in self._workers], self._seconds_to_deadline())
                by_conn = {worker.conn: worker for worker in self._workers}
                for source in ready:
                    if source is self._wake_recv:
                        self._wake_recv.recv(4096)
                    elif source in by_conn:
                        self._receive(by_conn[source])
                self._enforce_deadlines()
        except BaseException as error:  # a bug here must fail callers loudly, not leave them waiting
            log.exception("reward pool dispatcher failed")
            self._broken = f"RewardPool dispatcher failed: {error!r}"
        finally:
            self._shut_down()

    def _assign_work(self) -> None:
        for worker in list(self._workers):
            if not worker.ready or worker.chunk:
                continue
            if self.max_tasks_per_worker is not None and worker.tasks >= self.max_tasks_per_worker:
                self._recycle(worker)
                continue
            with self._lock:
                # Small chunks once the queue runs low, so the last samples spread over all workers.
                size = max(1, min(self.chunk_size, len(self._pending) // (2 * self.processes)))
                if self.max_tasks_per_worker is not None:
                    size = min(size, self.max_tasks_per_worker - worker.tasks)
                jobs = [self._pending.popleft() for _ in range(min(size, len(self._pending)))]
            if not jobs:
                return
            worker.chunk.extend(jobs)
            worker.sample_started = time.monotonic()
            try:
                worker.conn.send([(job.response, job.golds) for job in jobs])
            except (OSError, ValueError):  # died while idle; its EOF is handled by _receive
                pass

    def _receive(self, worker: _Worker) -> None:
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message == "ready":
                    worker.ready = True
                    self._startup_failures = 0
                    continue
                reward, seconds, error = message
                job = worker.chunk.popleft()
                worker.tasks += 1
                worker.sample_started = time.monotonic()
                if error is not None:  # the worker may be sick (at its memory cap): replace it
                    self._stats["replaced_after_error"] += 1
                    job.attempts += 1
                    if job.attempts < 2:
                        worker.chunk.appendleft(job)  # requeued below: scored once more, by another worker
                    else:
                        self._stats["errors"] += 1
                        job.future.set_result(RewardOutcome(float(reward), seconds, False, error))
                    self._replace(worker, None, why=error)
                    return
                job.future.set_result(RewardOutcome(float(reward), seconds, False, error))
        except (EOFError, OSError):
            worker.process.join(1.0)
            self._stats["replaced_after_death"] += 1
            self._stats["errors"] += bool(worker.chunk)
            self._replace(worker, RewardOutcome(0.0, time.monotonic() - worker.sample_started, False,
                                                f"reward worker died (exit code {worker.process.exitcode})"))

    def _enforce_deadlines(self) -> None:
        for worker in list(self._workers):
            now = time.monotonic()
            if worker.chunk and now >= worker.sample_started + self.timeout_s:
                self._receive(worker)  # a result that landed since the wait is not a timeout
                if worker in self._workers and worker.chunk and now >= worker.sample_started + self.timeout_s:
                    self._stats["replaced_after_timeout"] += 1
                    self._replace(worker, RewardOutcome(0.0, now - worker.sample_started, True, None))
            elif not worker.ready and now >= worker.started_at + STARTUP_TIMEOUT_S:
                self._replace(worker, None)

    def _seconds_to_deadline(self) -> float:
        deadlines = [w.sample_started + self.timeout_s for w in self._workers if w.chunk]
        deadlines += [w.started_at + STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else 3600.0

    def _recycle(self, worker: _Worker) -> None:
        """Stops an idle worker that has served max_tasks_per_worker samples, politely, and starts a new one."""
        worker.stop(kill=False)
        self._stats["recycled"] += 1
        log.info("reward worker %d recycled after %d samples", worker.process.pid, worker.tasks)
        self._workers[self._workers.index(worker)] = self._spawn()

    def _replace(self, worker: _Worker, outcome: RewardOutcome | None, why: str | None = None) -> None:
        """Kills `worker`, gives its current sample `outcome` (none: it is requeued with the rest), requeues the
        rest, starts a new worker."""
        worker.stop(kill=True)
        if worker.chunk and outcome is not None:
            worker.chunk.popleft().future.set_result(outcome)
        with self._lock:
            self._pending.extendleft(reversed(worker.chunk))
        if not worker.ready:
            self._startup_failures += 1
            if self._startup_failures >= MAX_STARTUP_FAILURES:
                raise RuntimeError(f"{MAX_STARTUP_FAILURES} reward workers in a row died while starting")
        why = why or ("no start" if outcome is None else "timeout" if outcome.timed_out else outcome.error)
        log.warning("reward worker %d replaced: %s", worker.process.pid, why)
        self._workers[self._workers.index(worker)] = self._spawn()

    def _shut_down(self) -> None:
        with self._lock:
            self._closed = True
            waiting = list(self._pending) + [job for w in self._workers for job in w.chunk]
            self._pending.clear()
        for worker in self._workers:
            worker.stop(kill=bool(worker.chunk) or not worker.ready)  # busy or still importing: no wait
        for job in waiting:
            if not job.future.done():
                job.future.set_exception(RuntimeError(self._broken or "RewardPool closed before scoring"))
        self._wake_recv.close()
        self._wake_send.close()

    def _wake(self) -> None:
        try:
            self._wake_send.send(b"\0")
        except (BlockingIOError, OSError):  # already awake (buffer full) or shut down
            pass


def _worker_main(conn: Connection, score_fn: ScoreFn, memory_limit_mb: int | None) -> None:
    """A worker process: warm up, then score chunks until told to stop (None) or the pipe closes."""
    import resource
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent stops us
    if memory_limit_mb is not None:
        limit = memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a blow-up raises MemoryError here
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it logs whole hostile inputs on timeouts
    score_answer(r"so \boxed{\frac{1}{2}}", ("0.5",), guard_s=None)  # first parse loads the grammar
    conn.send("ready")
    while (chunk := _receive_chunk(conn)) is not None:
        for response, golds in chunk:
            start = time.perf_counter()
            try:
                reward, error = float(score_fn(response, golds)), None
            except Exception as exc:  # MemoryError and RecursionError included: reported, not fatal
                reward, error = 0.0, f"{type(exc).__name__}: {str(exc)[:200]}"
            conn.send((reward, time.perf_counter() - start, error))


def _receive_chunk(conn: Connection) -> Sequence[tuple[Any, tuple[str, ...]]] | None:
    try:
        return conn.recv()
    except (EOFError, OSError):  # the parent is gone
        return None
