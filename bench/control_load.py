"""The control plane under load while a tiny training runs: request latency, and what the load does to step time.

    python bench/control_load.py                         # 4 clients, 50 requests/s in all, ~3 minutes
    python bench/control_load.py --clients 8 --rate 100 --phase-steps 6 --rounds 4 --json out.json

A tiny training (`configs/tiny.yaml`, evaluation off) runs in this process on local Ray with its control plane on
127.0.0.1. Its steps alternate between quiet phases (no requests) and load phases, `--phase-steps` steps each,
`--rounds` times, so that drift of the machine falls on both alike. In a load phase `--clients` threads send
requests back to back, held together to `--rate` requests per second by a shared token bucket (a bounded loop,
not a flood): GET /v1/status, /metrics, /v1/events, /v1/history, /livez in turn, and every tenth request an
authenticated PATCH /v1/params setting tau to the value it already has (accepted, logged, and a no-op for
selection). The first step of each phase is not counted (it straddles the switch).

It prints the latency per endpoint (p50 / p95 / p99 / max), the errors (anything but 2xx), the rate achieved,
and the median step time of quiet and load phases. The last line ends with the ratio load / quiet, against the
limit of 1.05 (step time changes by under 5%).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LIMIT = 1.05
TOKEN = "bench-control-load-token"
READS = ["/v1/status", "/metrics", "/v1/events", "/v1/history", "/livez"]


class TokenBucket:
    """At most `rate` acquisitions per second across all threads."""

    def __init__(self, rate: float):
        self.interval, self.next, self.lock = 1.0 / rate, time.monotonic(), threading.Lock()

    def acquire(self) -> None:
        with self.lock:
            now = time.monotonic()
            self.next = max(self.next + self.interval, now)
            wait = self.next - now
        if wait > 0:
            time.sleep(wait)


class LoadLoop:
    """`clients` threads sending requests while `active` is set, at most `rate` per second in all."""

    def __init__(self, url: str, clients: int, rate: float, tau: float):
        import httpx

        self.url, self.tau = url, tau
        self.bucket, self.active, self.stop = TokenBucket(rate), threading.Event(), threading.Event()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()
        self.clients = [httpx.Client(base_url=url, timeout=10.0, headers={"Authorization": f"Bearer {TOKEN}"})
                        for _ in range(clients)]
        self.threads = [threading.Thread(target=self._run, args=(c, i), daemon=True) for i, c in enumerate(self.clients)]
        self.active_seconds, self._since = 0.0, None

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def set_active(self, on: bool) -> None:
        if on and not self.active.is_set():
            self._since = time.monotonic()
            self.active.set()
        elif not on and self.active.is_set():
            self.active.clear()
            self.active_seconds += time.monotonic() - self._since

    def close(self) -> None:
        self.set_active(False)
        self.stop.set()
        for t in self.threads:
            t.join(timeout=15)
        for c in self.clients:
            c.close()

    def _run(self, client, index: int) -> None:
        n = index
        while not self.stop.is_set():
            if not self.active.wait(timeout=0.2):
                continue
            self.bucket.acquire()
            if not self.active.is_set():
                continue
            n += 1
            if n % 10 == 0:
                name, call = "PATCH /v1/params", lambda: client.patch("/v1/params", json={"tau": self.tau})
            else:
                path = READS[n % len(READS)]
                name, call = f"GET {path}", lambda p=path: client.get(p)
            start = time.perf_counter()
            try:
                ok = 200 <= call().status_code < 300
            except Exception:  # noqa: BLE001 - a failed request is an error, counted
                ok = False
            seconds = time.perf_counter() - start
            with self.lock:
                self.latency[name].append(seconds)
                if not ok:
                    self.errors[name] += 1


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def run(args: argparse.Namespace) -> dict:
    import numpy as np

    from pcl.config import load_config
    from pcl.runlog import METRICS_FILE, read_metrics
    from services.train import run_training, start_ray

    warmup, phases = args.warmup_steps, 2 * args.rounds
    steps = warmup + phases * args.phase_steps
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="pcl-control-load-")) / "run"
    cfg = load_config("configs/tiny.yaml", [
        f"run.steps={steps}", "run.eval_every=0", "run.time_budget_s=null", "control.port=0",
        f"control.token={TOKEN}", "checkpoint.every=0", *args.overrides])
    own_ray = start_ray()
    result: dict = {}
    trainer = threading.Thread(target=lambda: result.update(code=run_training(cfg, run_dir=str(run_dir))), daemon=True)
    trainer.start()

    def steps_done() -> int:
        path = run_dir / METRICS_FILE
        return sum("effective_ratio" in r for r in read_metrics(path)) if path.exists() else 0

    while not (run_dir / "control.json").exists() or steps_done() < warmup:
        if not trainer.is_alive():
            raise RuntimeError(f"the training ended early: {result}")
        time.sleep(0.2)
    url = json.loads((run_dir / "control.json").read_text())["url"]
    loop = LoadLoop(url, args.clients, args.rate, cfg.selection.tau)
    loop.start()
    phase_of: dict[int, str] = {}
    for phase in range(phases):
        name = "quiet" if phase % 2 == 0 else "load"
        first = warmup + phase * args.phase_steps + 1  # the first step that starts in this phase
        loop.set_active(name == "load")
        for step in range(first + 1, first + args.phase_steps):  # the phase's first step straddles the switch
            phase_of[step] = name
        while steps_done() < first + args.phase_steps - 1 and trainer.is_alive():
            time.sleep(0.05)
        print(f"  phase {phase + 1}/{phases} ({name}) done at step {steps_done()}", flush=True)
    loop.close()
    trainer.join(timeout=300)
    if own_ray:
        import ray

        ray.shutdown()
    records = {r["step"]: r for r in read_metrics(run_dir / METRICS_FILE) if "effective_ratio" in r}
    seconds = {k: [records[s]["step_seconds"] for s, p in phase_of.items() if p == k and s in records]
               for k in ("quiet", "load")}
    all_latency = [x for v in loop.latency.values() for x in v]
    requests = len(all_latency)
    return {
        "clients": args.clients, "rate_limit": args.rate, "requests": requests, "errors": dict(loop.errors),
        "achieved_rate": requests / loop.active_seconds if loop.active_seconds else 0.0,
        "latency_ms": {name: {"n": len(v), "p50": 1e3 * percentile(v, 50), "p95": 1e3 * percentile(v, 95),
                              "p99": 1e3 * percentile(v, 99), "max": 1e3 * max(v)}
                       for name, v in sorted({**loop.latency, "all": all_latency}.items()) if v},
        "step_seconds": {k: {"n": len(v), "median": float(np.median(v)), "mean": float(np.mean(v))}
                         for k, v in seconds.items() if v},
        "training_exit": result.get("code"),
        "run_dir": str(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second, all clients together")
    parser.add_argument("--phase-steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="quiet + load pairs")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--run-dir", help="where the run goes (default: a temporary directory)")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for the tiny run")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = run(args)
    print(f"\n{report['requests']} requests from {report['clients']} clients, limit {report['rate_limit']:g}/s, "
          f"achieved {report['achieved_rate']:.1f}/s; errors: {sum(report['errors'].values())} {report['errors']}")
    print(f"{'endpoint':<22}{'n':>7}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for name, row in report["latency_ms"].items():
        print(f"{name:<22}{row['n']:>7}{row['p50']:>9.2f}{row['p95']:>9.2f}{row['p99']:>9.2f}{row['max']:>9.1f}")
    quiet, load = report["step_seconds"]["quiet"], report["step_seconds"]["load"]
    ratio = load["median"] / quiet["median"]
    report["ratio"] = ratio
    print(f"step seconds, median: quiet {quiet['median']:.3f} ({quiet['n']} steps), "
          f"load {load['median']:.3f} ({load['n']} steps); means {quiet['mean']:.3f} / {load['mean']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    verdict = "PASS" if ratio <= LIMIT else "FAIL"
    print(f"{verdict}: step time under load / quiet (medians), limit {LIMIT}: {ratio:.3f}")
    return 0 if report["training_exit"] == 0 and not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
