"""What Ray itself keeps in a process that makes a run's actor calls: the memory of an actor that drives four others
with 16 calls a step (the coordinator's pattern: requests, weight syncs, pings), over tens of thousands of steps,
with Ray's task events on (its default) and off (`RAY_task_events_report_interval_ms=0`).

    python -m bench.ray_calls                        # 40,000 steps each way, about 15 minutes on 2 cores
    python -m bench.ray_calls --steps 10000 --json out.json

Each way runs in a child process of its own (Ray reads the setting as it starts) on a local Ray started as `pcl
train` starts it (`actors.runtime.start_ray`: the product's RAY_LIMITS). The driving actor's RSS and its count of
Python objects (gc) are read every `--chunk` steps. It prints, each way, the RSS series and its growth in bytes a
step over the first and the second half of the steps, and the ratio of the two ways' second halves. Nothing of the
product runs in the calls (they return their argument): what grows is Ray's (its core worker, its task events) or
the allocator's. Memory figures hardly depend on what else runs on the machine; the time does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench import ROOT, add_json_option, run, write_figures

CALLS = (4, 4)  # workers, calls to each a step


def measure(steps: int, chunk: int) -> list[dict]:
    """In this process: the driving actor's RSS and gc object count after every `chunk` steps."""
    import ray

    from actors.runtime import start_ray

    start_ray()

    @ray.remote(num_cpus=0)
    class Worker:
        def call(self, x):
            return x

    @ray.remote(num_cpus=0)
    class Driver:
        def __init__(self, workers):
            self.workers = workers

        def steps(self, n: int) -> int:
            for i in range(n):
                ray.get([w.call.remote(i) for w in self.workers for _ in range(CALLS[1])])
            return n

        def memory(self) -> tuple[int, int]:
            import gc

            import psutil

            return psutil.Process().memory_info().rss, len(gc.get_objects())

    driver = Driver.remote([Worker.remote() for _ in range(CALLS[0])])
    samples, done, start = [], 0, time.monotonic()
    while done < steps:
        done += ray.get(driver.steps.remote(min(chunk, steps - done)))
        rss, objects = ray.get(driver.memory.remote())
        samples.append({"steps": done, "seconds": round(time.monotonic() - start, 1), "rss": rss, "objects": objects})
        print(f"  {samples[-1]['seconds']:7.1f} s  step {done:6d}  RSS {rss / 1e6:8.2f} MB  objects {objects}",
              flush=True)
    ray.shutdown()
    return samples


def growth(samples: list[dict]) -> dict:
    """Bytes a step over the first and the second half of the samples (from the first sample on)."""
    mid = len(samples) // 2
    first, middle, last = samples[0], samples[mid], samples[-1]

    def per_step(a: dict, b: dict) -> float:
        return (b["rss"] - a["rss"]) / max(1, b["steps"] - a["steps"])

    return {"first_half_bytes_per_step": per_step(first, middle), "second_half_bytes_per_step": per_step(middle, last),
            "rss_first": first["rss"], "rss_last": last["rss"], "objects_first": first["objects"],
            "objects_last": last["objects"]}


def child(way: str, steps: int, chunk: int) -> list[dict]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    if way == "off":
        env["RAY_task_events_report_interval_ms"] = "0"
    out = subprocess.run([sys.executable, "-m", "bench.ray_calls", "--child", "--steps", str(steps), "--chunk",
                          str(chunk)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=True)
    lines = out.stdout.splitlines()
    print("\n".join(line for line in lines if not line.startswith("{")), flush=True)
    return json.loads(next(line for line in lines if line.startswith("{")))["samples"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40000)
    parser.add_argument("--chunk", type=int, default=2000, help="steps between two readings")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.steps < 2 * args.chunk or args.chunk < 1:
        parser.error(f"--steps ({args.steps}) must be at least twice --chunk ({args.chunk}), and --chunk at least 1")
    if args.child:
        print(json.dumps({"samples": measure(args.steps, args.chunk)}), flush=True)
        return {}
    figures: dict = {"steps": args.steps, "calls_a_step": CALLS[0] * CALLS[1]}
    for way in ("on", "off"):
        print(f"task events {way}:", flush=True)
        samples = child(way, args.steps, args.chunk)
        figures[way] = {**growth(samples), "samples": samples}
        g = figures[way]
        print(f"task events {way}: RSS {g['rss_first'] / 1e6:.2f} MB at step {samples[0]['steps']} -> "
              f"{g['rss_last'] / 1e6:.2f} MB at step {samples[-1]['steps']}; bytes a step: first half "
              f"{g['first_half_bytes_per_step']:.0f}, second half {g['second_half_bytes_per_step']:.0f}; Python "
              f"objects {g['objects_first']} -> {g['objects_last']}", flush=True)
    on, off = figures["on"]["second_half_bytes_per_step"], figures["off"]["second_half_bytes_per_step"]
    print(f"second half, task events on / off: {on:.0f} / {off:.0f} bytes a step"
          + (f" (x{on / off:.1f})" if off > 0 and on > 0 else ""))
    return write_figures(args.json, figures)


if __name__ == "__main__":
    run(main)
