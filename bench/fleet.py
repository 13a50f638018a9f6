"""A step's generation on rollout fleets of different sizes: W = 1 and W = 2 rollout workers of one thread each,
and W = 1 with two threads (the demo's setting), on the tiny-carry task with the HF engine.

    python -m bench.fleet                                  # m = 64 prompts x n = 8, median of 3 steps per fleet
    python -m bench.fleet --m 16 --repeats 1 --json out.json

Each fleet is started afresh (local Ray, an embedded Redis server, its rollout workers and one verifier actor, as
`pcl train` starts them) and generates `--repeats` steps of m training prompts x n samples through the streams and
math-verify, after one warm-up step; the median step counts. For each fleet it prints the step's seconds and each
worker's share of the samples (`rollout_samples_by_worker`); the last line is the speed-up of two one-thread
workers over one. Goal: >= 1.6x on 2 cores, and two one-thread workers no slower than one two-thread worker.
Timing figures need a quiet machine: other processes on the cores change them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench import ROOT, add_json_option, run, write_figures

CONFIG = ROOT / "configs" / "tiny-carry.yaml"
FLEETS = (("W=1, 1 thread", 1, 1), ("W=2, 1 thread each", 2, 1), ("W=1, 2 threads", 1, 2))


def start_actors(cfg, policy_path: str, answers: dict, redis_url: str) -> list:
    """One verifier and the config's rollout workers, each answering; returns their handles (verifier first)."""
    import ray

    from actors.rollout import RolloutWorker
    from actors.verifier import RewardVerifier
    from pcl.engines import max_model_len

    policy = cfg.model.model_copy(update={"path": policy_path})
    actors = [RewardVerifier.remote(cfg.verifier, cfg.redis, cfg.run, redis_url, 0, ray.put(answers))]
    actors += [RolloutWorker.remote(cfg.rollout, cfg.redis, cfg.run, policy, redis_url, i, max_model_len(cfg))
               for i in range(cfg.rollout.num_workers)]
    ray.get([a.ping.remote() for a in actors], timeout=cfg.learner.timeout_s)
    return actors


def time_fleet(cfg, policy_path: str, prompts: list, repeats: int, scratch: Path) -> dict:
    """Median seconds of a step's generation on a fresh fleet, and each worker's share of the last step."""
    import ray

    from services.redis_server import start_embedded
    from services.streams.rollout_client import RolloutClient

    answers = {p.id: p.answer for p in prompts}
    m, n = cfg.run.m, cfg.run.n
    with start_embedded(scratch, appendonly=False) as redis_server:
        actors = start_actors(cfg, policy_path, answers, redis_server.url)
        try:
            client = RolloutClient(cfg, redis_server.url)
            client.generate(0, 0, prompts[:m], n)  # warm-up: first-call costs are not a step's
            seconds = []
            for step in range(1, repeats + 1):
                batch = prompts[step * m:(step + 1) * m] if len(prompts) >= (step + 1) * m else prompts[:m]
                start = time.perf_counter()
                client.generate(step, 0, batch, n)
                seconds.append(time.perf_counter() - start)
            shares = client.counters()["rollout_samples_by_worker"]
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)
    return {"seconds": statistics.median(seconds), "all_seconds": seconds, "samples_by_worker": shares}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=64, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per fleet (the median counts)")
    add_json_option(parser)
    args = parser.parse_args(argv)

    import ray

    from actors.runtime import start_ray
    from pcl.config import load_config
    from pcl.data.inputs import run_inputs, training_prompts

    base = [f"run.m={args.m}", f"run.n={args.n}", "selection.type=uniform", "run.name=bench-fleet",
            "verifier.num_workers=1", "control.enabled=false"]
    inputs = run_inputs(load_config(CONFIG, base))
    prompts, _ = training_prompts(load_config(CONFIG, base), inputs.tokenizer)
    own_ray = start_ray()
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="pcl-bench-fleet-") as tmp:
            for index, (name, workers, threads) in enumerate(FLEETS):
                cfg = load_config(CONFIG, [*base, f"rollout.num_workers={workers}", f"rollout.threads={threads}",
                                           f"rollout.max_in_flight={args.m}"])
                results[name] = row = time_fleet(cfg, inputs.policy_path, prompts, args.repeats,
                                                 Path(tmp) / f"redis-{index}")
                total = sum(row["samples_by_worker"].values()) or 1
                shares = ", ".join(f"{worker} {count} ({count / total:.0%})"
                                   for worker, count in row["samples_by_worker"].items())
                print(f"{name:<20} {row['seconds']:7.3f} s a step   samples by worker: {shares}", flush=True)
    finally:
        if own_ray:
            ray.shutdown()
    one, two, threaded = (results[name]["seconds"] for name, _, _ in FLEETS)
    print(f"W=2 (1 thread each) vs W=1 with 2 threads: {threaded / two:.2f}x")
    print(f"speed-up of W=2 over W=1 (1 thread each): {one / two:.2f}x")
    return write_figures(args.json, {"m": args.m, "n": args.n, "repeats": args.repeats, "fleets": results,
                                     "two_over_two_threads": threaded / two, "speedup_w2_over_w1": one / two})


if __name__ == "__main__":
    run(main)
