"""`pcl probe-batch`: generation seconds per step over batch sizes b = m*n on the configured fleet, the knee
where growth turns from sublinear to linear, and the recommended b and (m, n).

    pcl probe-batch configs/tiny.yaml [--sizes 64,128,...] [--repeats 2] [key=value ...]

It starts what generation needs and nothing else: Redis (embedded unless configured), Ray, the rollout workers
and the reward verifiers of the config, with the initial policy. Each size is generated `repeats` times, as a
training step does it (m distinct training prompts, n responses each, through the streams and math-verify),
after one warm-up call; the median counts. n stays the configured run.n; m = b / n.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from pcl.tools.batch_size import find_knee
from pcl.config import Config, ConfigError


def default_sizes(n: int, count: int = 8) -> list[int]:
    """Doubling batch sizes from 8n (m = 8) over `count` doublings: 8n, 16n, ..., 1024n."""
    return [n * 8 * 2**i for i in range(count)]


def start_generation_fleet(cfg: Config, prep, redis_url: str) -> list:
    """The config's rollout workers and verifiers, each answering; returns their handles."""
    import ray

    from actors.rollout import RolloutWorker
    from actors.verifier import RewardVerifier
    from pcl.engines import max_model_len

    policy = cfg.model.model_copy(update={"path": prep.policy_path})  # the model section, with the local copy
    answers = ray.put(prep.answers)
    actors = [RewardVerifier.remote(cfg.verifier, cfg.redis, cfg.run, redis_url, i, answers)
              for i in range(cfg.verifier.num_workers)]
    actors += [RolloutWorker.options(num_gpus=cfg.rollout.num_gpus_per_worker).remote(
        cfg.rollout, cfg.redis, cfg.run, policy, redis_url, i, max_model_len(cfg))
        for i in range(cfg.rollout.num_workers)]
    ray.get([a.ping.remote() for a in actors], timeout=cfg.learner.timeout_s)
    return actors


def measure(cfg: Config, sizes: list[int], repeats: int, log: Callable[[str], None] = print) -> list[dict]:
    """Median generation seconds of each batch size on a freshly started fleet: [{b, m, n, seconds}]."""
    import ray

    from pcl.progress import Progress
    from services.streams.rollout_client import RolloutClient
    from services.redis_server import open_redis
    from actors.runtime import start_ray
    from entrypoints.train import prepare

    n = cfg.run.n
    with tempfile.TemporaryDirectory(prefix="pcl-probe-") as tmp:
        prep = prepare(cfg.model_copy(update={"run": cfg.run.model_copy(update={"m": 1})}), tmp, None)
        usable = [b for b in sizes if b // n <= len(prep.train_prompts)]
        if len(usable) < len(sizes):
            log(f"pcl: skipping sizes above {len(prep.train_prompts) * n}: the training set has "
                f"{len(prep.train_prompts)} distinct prompts")
        redis = open_redis(cfg.redis, Path(tmp) / "redis")
        own_ray, actors = False, []
        try:
            own_ray = start_ray()
            actors = start_generation_fleet(cfg, prep, redis.url)
            client = RolloutClient(cfg, redis.url)
            client.generate(0, 0, prep.train_prompts[:8], n)  # warm-up: first-call costs are not the batch's
            rows, step = [], 1
            # the samples of every timed call: a bar on a terminal, else a line at each tenth
            with Progress(sum(b // n * n for b in usable) * repeats, "probe-batch", "sample", stream=sys.stderr) as bar:
                for b in usable:
                    m = b // n
                    times = []
                    for _ in range(repeats):
                        start, before = time.perf_counter(), bar.done
                        client.generate(step, 0, prep.train_prompts[:m], n,
                                        on_progress=lambda done, _total, before=before: bar.set(before + done))
                        times.append(time.perf_counter() - start)
                        step += 1  # a fresh step each call: nothing of an earlier call is ever collected
                    rows.append({"b": m * n, "m": m, "n": n, "seconds": statistics.median(times)})
                    log(f"  b={m * n:>7}  {rows[-1]['seconds']:8.3f} s")
            return rows
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)
            if own_ray:
                ray.shutdown()
            redis.close()


def report(rows: list[dict], n: int) -> str:
    """The table and the recommendation, as printed."""
    knee = find_knee([r["b"] for r in rows], [r["seconds"] for r in rows])
    lines = [f"{'b = m*n':>9} {'m':>7} {'n':>4} {'seconds':>9} {'ms / 1k samples':>16} {'growth exponent':>16}"]
    for i, r in enumerate(rows):
        exponent = f"{knee.exponents[i]:.2f}" if i < len(knee.exponents) else "-"
        mark = "  <- knee" if i == knee.index and knee.found else ""
        lines.append(f"{r['b']:>9} {r['m']:>7} {r['n']:>4} {r['seconds']:>9.3f} {1e6 * r['seconds'] / r['b']:>16.1f} "
                     f"{exponent:>16}{mark}")
    b = knee.batch_size
    if knee.found:
        lines.append(f"from b={b} on the time per sample stays flat (generation time grows linearly); below it a "
                     f"larger batch costs little more time")
    else:
        lines.append(f"the time per sample was still falling at the largest size, b={b}: the knee may lie beyond "
                     f"the sizes measured (probe larger sizes with --sizes)")
    lines.append(f"recommended: b = {b}, (m, n) = ({b // n}, {n})")
    return "\n".join(lines)


def probe_batch(cfg: Config, sizes: list[int] | None = None, repeats: int = 2) -> int:
    """The `pcl probe-batch` command: measure, then print the table and the recommendation."""
    sizes = sorted(set(sizes or default_sizes(cfg.run.n)))
    bad = [b for b in sizes if b < cfg.run.n or b % cfg.run.n]
    if bad or len(sizes) < 2:
        raise ConfigError(f"--sizes: give two or more batch sizes, each a multiple of run.n={cfg.run.n} "
                          f"(b = m*n); got {sizes}")
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    print(f"pcl: generation time over batch sizes {sizes} ({cfg.rollout.num_workers} {cfg.rollout.engine} "
          f"worker(s), n={cfg.run.n}, median of {repeats})", flush=True)
    rows = measure(cfg, sizes, repeats)
    if len(rows) < 2:
        raise ConfigError("fewer than two batch sizes fit the training set; give smaller --sizes")
    print(report(rows, cfg.run.n), flush=True)
    return 0
