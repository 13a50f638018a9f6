"""An engine whose every call runs on one dedicated thread.

    engine = PinnedEngine(lambda: make_engine(cfg.rollout, path, seed))   # built on that thread too
    engine.generate(prompts, params)        # from any thread: runs on the engine's thread
    engine.load_weights(weights, version)   # likewise; attributes (policy_version) read through

Torch's CPU kernels parallelise with OpenMP, whose runtime keeps one thread team per calling thread. A
rollout worker calls its engine from two threads (the serving loop generates; the actor's methods load
weights), which gives two teams on the same cores; libgomp then manages more threads than there are CPUs
and cuts its spin-waits short, so every parallel region ends in futex sleeps and wake-ups. Measured on 2
cores: 64 prompts x 8 tiny generations took 0.19-0.20 s on a thread of a process whose main thread had run
one parallel region, 0.13 s otherwise. Keeping every call on one thread keeps one team.
"""

from __future__ import annotations

import functools
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from pcl.engines.base import Engine


class PinnedEngine:
    """Wraps the engine `build()` returns; its methods run on one thread, one call at a time."""

    def __init__(self, build: Callable[[], Engine]) -> None:
        object.__setattr__(self, "_executor", ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine"))
        object.__setattr__(self, "engine", self._call(build))

    def _call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._executor.submit(function, *args, **kwargs).result()  # its exception re-raised here

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.engine, name)
        return functools.partial(self._call, value) if inspect.ismethod(value) else value  # a module passes

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.engine, name, value)  # e.g. a restored sampling counter

    def close(self) -> None:
        try:
            self._call(self.engine.close)
        finally:
            self._executor.shutdown(wait=True)
