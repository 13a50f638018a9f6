"""The control plane under load while a tiny training runs: request latency, and the load's cost in step time.

    python -m bench.control_load                    # 4 clients, 50 requests/s in all: 4-5 minutes on 2 cores
    python -m bench.control_load --clients 8 --rate 100 --phase-steps 6 --rounds 4 --json out.json
    python -m bench.control_load run.m=16 run.n=4   # config overrides for the training run

A tiny training (`configs/tiny.yaml`: the embedded default's per-step work, evaluation and periodic
checkpoints off) runs in this process, on local Ray, with its control plane on 127.0.0.1 (a free port, read
from RUN_DIR/control.json). After `--warmup-steps` steps, the steps alternate between quiet phases (no
requests) and load phases, `--phase-steps` steps each, `--rounds` rounds of one each, quiet-load then
load-quiet (ABBA), so that a steady drift, of the machine or of the work per step (the policy's answers change
as it trains), falls on both alike. The phase switches when the previous step's record reaches
RUN_DIR/metrics.jsonl, so the first step of each phase straddles the switch and is not counted.

In a load phase `--clients` threads send requests back to back, held together to `--rate` requests per second
by a shared token bucket (a bounded loop, not a flood). Each client goes round MIX: GET /v1/status, /metrics,
/v1/events (the newest 200), /v1/history (after the newest step the client has, as the dashboard asks for it)
and /livez, and one request in ten an authenticated PATCH /v1/params setting tau to its current value (read
from /v1/status before the first load phase). Such a PATCH is accepted (202) and logged as `params_requested`,
but changes nothing: the bench checks that no `params_applied` event was recorded and that every step in
metrics.jsonl ran with that tau.

It prints the requests made, the errors (anything but 2xx), the latency per endpoint and overall (p50 / p95 /
p99 / max), the rate achieved, the mean and median step time of the quiet and load phases (and the ratio per
round), and the CPU this process (driver, control plane, load clients) and the embedded Redis used in each
kind of phase: where the cost of the load goes on a machine the actors keep busy. The last line is PASS or
FAIL: the ratio of the medians load / quiet against the limit of 1.05 (step time changes by at most 5%). The
exit code is 1 when the measurement is void (an error response, the training failing, tau changing), else 0;
with --strict, 2 on FAIL. Results: docs/results/control-load.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench import ROOT, write_figures

LIMIT = 1.05
TOKEN = "bench-control-load-token-0123456789"
PATCH = "PATCH /v1/params"
MIX = (
    "GET /v1/status", "GET /metrics", "GET /v1/events", "GET /v1/history", "GET /livez",
    "GET /v1/status", "GET /metrics", "GET /v1/events", "GET /v1/history", PATCH,
)


class TokenBucket:
    """At most `rate` acquisitions per second across all threads, evenly spaced (no bursts after idling)."""

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
    """`clients` threads sending MIX while `active` is set, at most `rate` requests per second in all."""

    def __init__(self, url: str, clients: int, rate: float, tau: float):
        import httpx

        self.tau = tau
        self.bucket, self.active, self.stop = TokenBucket(rate), threading.Event(), threading.Event()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, Counter] = defaultdict(Counter)
        self.lock = threading.Lock()
        auth = {"Authorization": f"Bearer {TOKEN}"}
        self.clients = [httpx.Client(base_url=url, timeout=10.0, headers=auth) for _ in range(clients)]
        self.threads = [
            threading.Thread(target=self._run, args=(client, index), daemon=True, name=f"load-client-{index}")
            for index, client in enumerate(self.clients)
        ]
        self.after = [-1] * clients  # each client's newest history step, as the dashboard keeps it
        self.active_seconds, self._since, self.client_cpu = 0.0, 0.0, 0.0

    def start(self) -> "LoadLoop":
        for thread in self.threads:
            thread.start()
        return self

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
        for thread in self.threads:
            thread.join(timeout=15)
        for client in self.clients:
            client.close()

    def _send(self, client, index: int, name: str):
        method, path = name.split(" ", 1)
        if name == PATCH:
            return client.patch(path, json={"tau": self.tau})
        if path == "/v1/history":
            response = client.get(path, params={"after": self.after[index]})
            records = response.json()["records"] if response.status_code == 200 else []
            self.after[index] = max([self.after[index]] + [r["step"] for r in records])
            return response
        return client.request(method, path)

    def _run(self, client, index: int) -> None:
        turn = index * 3  # clients start at different places in MIX
        while not self.stop.is_set():
            if not self.active.wait(timeout=0.2):
                continue
            self.bucket.acquire()
            if not self.active.is_set():
                continue
            name = MIX[turn % len(MIX)]
            turn += 1
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                code = str(self._send(client, index, name).status_code)
            except Exception as exc:  # noqa: BLE001 - a failed request is an error, counted by its kind
                code = type(exc).__name__
            seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
            with self.lock:
                self.latency[name].append(seconds)
                self.client_cpu += cpu
                if not code.startswith("2"):
                    self.errors[name][code] += 1


class TrainingThread(threading.Thread):
    """`run_training(cfg, run_dir)` in a thread; `.result` is its exit code or the exception it raised."""

    def __init__(self, cfg, run_dir: Path):
        super().__init__(daemon=True, name="pcl-training")
        self.cfg, self.run_dir, self.result = cfg, run_dir, None

    def run(self) -> None:
        from entrypoints.train import run_training

        try:
            self.result = run_training(self.cfg, run_dir=str(self.run_dir))
        except BaseException as exc:  # noqa: BLE001 - reported by the bench
            self.result = exc


class CpuMeter:
    """CPU seconds per phase kind of this process (the driver, the control plane and the load clients) and of
    the embedded Redis it started; the actors' processes are Ray's, not counted here."""

    def __init__(self):
        import psutil

        self.me = psutil.Process()
        self.redis = [p for p in self.me.children(recursive=True) if "redis-server" in p.name()]
        self.used: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.phase, self.last = None, self._read()

    @staticmethod
    def _cpu(process) -> float:
        try:
            times = process.cpu_times()
        except Exception:  # noqa: BLE001 - a process gone counts no more
            return 0.0
        return times.user + times.system

    def _read(self) -> dict[str, float]:
        # This process by its nanosecond clock: /proc counts whole ticks (10 ms), and a quiet phase of a
        # short run can use less than one.
        return {"wall": time.monotonic(), "process": time.process_time(),
                "redis": sum(self._cpu(p) for p in self.redis)}

    def switch(self, phase: str | None) -> None:
        """The phase running from now on (None: stop counting)."""
        now = self._read()
        if self.phase is not None:
            for key, value in now.items():
                self.used[self.phase][key] += value - self.last[key]
        self.phase, self.last = phase, now

    def cores(self) -> dict[str, dict[str, float]]:
        """Mean cores used per phase kind."""
        return {phase: {key: used[key] / used["wall"] for key in ("process", "redis")}
                for phase, used in self.used.items()}


class StepWatcher:
    """The training step records of RUN_DIR/metrics.jsonl, read incrementally (complete lines only)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.records = path, 0, {}

    def done(self) -> int:
        """Training steps recorded so far."""
        if self.path.exists():
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                for line in f:
                    if not line.endswith("\n"):
                        break
                    self.offset += len(line.encode("utf-8"))
                    record = json.loads(line)
                    if "step_seconds" in record:  # a training step, not an evaluation record
                        self.records[int(record["step"])] = record
        return len(self.records)

    def wait_for(self, steps: int, trainer: TrainingThread, poll_s: float = 0.05) -> None:
        while self.done() < steps:
            if not trainer.is_alive():
                raise RuntimeError(f"the training ended at step {self.done()} of {steps}: {trainer.result!r}")
            time.sleep(poll_s)


def schedule(warmup: int, phase_steps: int, rounds: int) -> list[tuple[str, int, int]]:
    """(phase, first step, last step) of each phase; steps are numbered as in metrics.jsonl. Rounds go quiet
    then load, load then quiet, and so on (ABBA): over an even number of rounds a steady drift of step time
    falls on both kinds alike."""
    phases = []
    for index in range(2 * rounds):
        first = warmup + index * phase_steps + 1
        load = index % 2 == 1 if (index // 2) % 2 == 0 else index % 2 == 0
        phases.append(("load" if load else "quiet", first, first + phase_steps - 1))
    return phases


def latency_row(seconds: list[float]) -> dict:
    import numpy as np

    ms = 1e3 * np.asarray(seconds)
    return {"n": len(seconds), "p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)),
            "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}


def step_row(seconds: list[float]) -> dict:
    return {"n": len(seconds), "mean": statistics.fmean(seconds), "median": statistics.median(seconds)}


def wait_for_url(run_dir: Path, trainer: TrainingThread) -> str:
    path = run_dir / "control.json"
    while not path.exists():
        if not trainer.is_alive():
            raise RuntimeError(f"the training ended before serving its control plane: {trainer.result!r}")
        time.sleep(0.1)
    url = json.loads(path.read_text())["url"]
    if not url:
        raise RuntimeError("the run serves no control plane (control.enabled is false)")
    return url


def step_table(phases: list[tuple[str, int, int]], records: dict[int, dict]) -> list[dict]:
    """One row per phase step: its phase, whether it counts (not the first of its phase), its seconds."""
    return [{"step": step, "phase": name, "counted": step > first, "seconds": records[step]["step_seconds"]}
            for name, first, last in phases for step in range(first, last + 1)]


def round_ratios(phases: list[tuple[str, int, int]], steps_table: list[dict]) -> list[dict]:
    """The quiet and the load phase of each round side by side: their median step times and ratio."""
    rounds = []
    for index in range(0, len(phases), 2):
        medians = {name: statistics.median(s["seconds"] for s in steps_table
                                           if s["counted"] and first <= s["step"] <= last)
                   for name, first, last in phases[index:index + 2]}
        rounds.append({"quiet_median": medians["quiet"], "load_median": medians["load"],
                       "ratio": medians["load"] / medians["quiet"]})
    return rounds


def run(args: argparse.Namespace) -> dict:
    import httpx

    from pcl.config import load_config
    from pcl.loop.runlog import METRICS_FILE
    from actors.runtime import start_ray

    phases = schedule(args.warmup_steps, args.phase_steps, args.rounds)
    steps = phases[-1][2] + 1  # one step more: the control plane still answers when the last phase ends
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="pcl-control-load-")) / "run"
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [
        f"run.steps={steps}", "run.eval_every=0", "run.time_budget_s=null", "checkpoint.every=0",
        "control.host=127.0.0.1", "control.port=0", f"control.token={TOKEN}", *args.overrides])
    started = time.monotonic()
    own_ray = start_ray()
    trainer = TrainingThread(cfg, run_dir)
    trainer.start()
    loop = None
    try:
        url = wait_for_url(run_dir, trainer)
        watcher = StepWatcher(run_dir / METRICS_FILE)
        watcher.wait_for(args.warmup_steps, trainer)
        with httpx.Client(base_url=url, timeout=10.0) as http:
            tau = http.get("/v1/status").json()["tau"]
        print(f"  {url}: warm-up done at step {watcher.done()}, tau {tau}", flush=True)
        loop, meter = LoadLoop(url, args.clients, args.rate, tau).start(), CpuMeter()
        for name, first, last in phases:
            watcher.wait_for(first - 1, trainer)  # the previous phase's last step is done: switch
            loop.set_active(name == "load")
            meter.switch(name)
            print(f"  steps {first}-{last}: {name}", flush=True)
        watcher.wait_for(phases[-1][2], trainer)
        loop.close()
        meter.switch(None)
        with httpx.Client(base_url=url, timeout=10.0) as http:  # the trailing step is in flight
            events = Counter(e["type"] for e in http.get("/v1/events", params={"limit": 10_000}).json())
    finally:
        if loop is not None and not loop.stop.is_set():
            loop.close()
        trainer.join(timeout=600)
        if own_ray:
            import ray

            ray.shutdown()
    watcher.done()
    steps_table = step_table(phases, watcher.records)
    latency = {name: latency_row(values) for name, values in sorted(loop.latency.items())}
    everything = [x for values in loop.latency.values() for x in values]
    latency["all"] = latency_row(everything)
    quiet, load = (step_row([s["seconds"] for s in steps_table if s["counted"] and s["phase"] == name])
                   for name in ("quiet", "load"))
    ratio = load["median"] / quiet["median"]
    rounds = round_ratios(phases, steps_table)
    taus = sorted({r.get("tau") for r in watcher.records.values()}, key=repr)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "config": {"clients": args.clients, "rate_limit": args.rate, "warmup_steps": args.warmup_steps,
                   "phase_steps": args.phase_steps, "rounds": args.rounds, "steps": steps,
                   "overrides": list(args.overrides)},
        "requests": len(everything),
        "errors": {name: dict(codes) for name, codes in loop.errors.items()},
        "error_count": sum(sum(codes.values()) for codes in loop.errors.values()),
        "load_seconds": loop.active_seconds,
        "achieved_rate": len(everything) / loop.active_seconds if loop.active_seconds else 0.0,
        "cpu_cores": {**meter.cores(), "load_clients": loop.client_cpu / loop.active_seconds},
        "latency_ms": latency,
        "step_seconds": {"quiet": quiet, "load": load},
        "ratio": ratio,
        "rounds": rounds,
        "limit": LIMIT,
        "verdict": "PASS" if ratio <= LIMIT else "FAIL",
        "tau": tau,
        "taus_in_metrics": taus,
        "events": dict(events),
        "steps": steps_table,
        "training_exit": trainer.result if isinstance(trainer.result, int) else repr(trainer.result),
        "wall_seconds": time.monotonic() - started,
        "run_dir": str(run_dir),
    }


def void_reasons(report: dict) -> list[str]:
    """Why the measurement does not stand (empty when it does)."""
    reasons = []
    if report["training_exit"] != 0:
        reasons.append(f"the training did not finish cleanly: {report['training_exit']}")
    if report["error_count"]:
        reasons.append(f"{report['error_count']} requests failed: {report['errors']}")
    if report["taus_in_metrics"] != [report["tau"]] or report["events"].get("params_applied"):
        reasons.append(f"tau changed: steps ran with {report['taus_in_metrics']}, events {report['events']}")
    return reasons


def format_report(report: dict) -> str:
    cfg = report["config"]
    lines = [
        f"{report['requests']} requests from {cfg['clients']} clients in {report['load_seconds']:.1f} s "
        f"of load, "
        f"limit {cfg['rate_limit']:g}/s, achieved {report['achieved_rate']:.1f}/s; "
        f"errors (non-2xx): {report['error_count']} {report['errors'] or ''}".rstrip(),
        f"PATCH /v1/params tau={report['tau']} (no-op): events {report['events']}, "
        f"steps ran with tau {report['taus_in_metrics']}",
        "",
        f"{'endpoint':<20}{'n':>7}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}",
    ]
    for name, row in report["latency_ms"].items():
        lines.append(f"{name:<20}{row['n']:>7}{row['p50']:>9.2f}{row['p95']:>9.2f}{row['p99']:>9.2f}"
                     f"{row['max']:>9.1f}")
    quiet, load = report["step_seconds"]["quiet"], report["step_seconds"]["load"]
    cpu = report["cpu_cores"]
    lines += [
        "",
        f"step seconds ({cfg['rounds']} rounds of {cfg['phase_steps']} quiet + {cfg['phase_steps']} load "
        f"steps in ABBA order, the first step of each phase not counted):",
        f"  quiet  {quiet['n']:>3} steps  median {quiet['median']:.3f}  mean {quiet['mean']:.3f}",
        f"  load   {load['n']:>3} steps  median {load['median']:.3f}  mean {load['mean']:.3f}",
        f"  load / quiet: median {report['ratio']:.3f}, mean {load['mean'] / quiet['mean']:.3f}; by round "
        + " ".join(f"{r['ratio']:.3f}" for r in report["rounds"]),
        f"CPU, mean cores (quiet / load): this process {cpu['quiet']['process']:.3f} / "
        f"{cpu['load']['process']:.3f} (the load clients {cpu['load_clients']:.3f} of it), embedded Redis "
        f"{cpu['quiet']['redis']:.3f} / {cpu['load']['redis']:.3f}",
        f"wall {report['wall_seconds']:.0f} s; run dir {report['run_dir']}",
        f"{report['verdict']}: step time under load / quiet (medians) {report['ratio']:.3f}, limit {LIMIT}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads (default 4)")
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second, all clients together")
    parser.add_argument("--phase-steps", type=int, default=10, help="steps per phase (default 10)")
    parser.add_argument("--rounds", type=int, default=6, help="quiet + load pairs, even for ABBA (default 6)")
    parser.add_argument("--warmup-steps", type=int, default=5,
                        help="steps before the first phase (default 5)")
    parser.add_argument("--run-dir", help="where the run goes (default: a temporary directory)")
    parser.add_argument("--json", metavar="PATH", help="also write the report (the figures) to PATH as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 2 on FAIL")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for the tiny run")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.rate <= 0 or args.phase_steps < 2 or args.rounds < 1 or args.warmup_steps < 1:
        parser.error("need --clients >= 1, --rate > 0, --phase-steps >= 2, --rounds >= 1, "
                     "--warmup-steps >= 1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = run(args)
    print("\n" + format_report(report), flush=True)
    reasons = void_reasons(report)
    for reason in reasons:
        print(f"void: {reason}", file=sys.stderr, flush=True)
    # exit 1: the measurement is void; 2: FAIL with --strict
    report["exit_code"] = 1 if reasons else 2 if args.strict and report["verdict"] == "FAIL" else 0
    return write_figures(args.json, report)


if __name__ == "__main__":
    sys.exit(main()["exit_code"])
