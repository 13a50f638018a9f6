"""A frozen worker must not freeze the run: the step rate of a real run while one of its two rollout workers, then
one of its two verifiers, is stopped (SIGSTOP) for a while, against its healthy step rate.

    python -m bench.stragglers                                   # configs/chaos.yaml
    python -m bench.stragglers --hold 60 redis.visibility_timeout_s=30 --json out.json

`pcl train CONFIG` runs as a child process (local Ray, the embedded Redis, 2 rollout workers, 2 verifiers, the
control plane off), with the product's default visibility timeout (`redis.visibility_timeout_s=30`; the chaos
config's 3 s, meant for a quiet machine, has a loaded one's healthy passes reclaimed and done twice, and would move
a frozen worker's entries before its straggler timeout does) and stuck timeouts (300 s, 120 s: the chaos config's
25 s restarts the frozen worker within the hold, which then also costs a model load; pass
`rollout.stuck_timeout_s=25 verifier.stuck_timeout_s=25` to measure that). Once it has trained a few steps, the healthy step rate is measured over `--healthy-steps`
steps; then one rollout worker's process (found by its Ray title, `ray::RolloutWorker`) is stopped with SIGSTOP,
held `--hold` seconds (by default max(60 s, as long as the healthy steps took), so that the hold spans that many
healthy steps on a loaded machine too) and continued with SIGCONT; after a settling time (3 healthy steps) the same
is done to a verifier's process (`ray::RewardVerifier`). A step's time is when its record appears in metrics.jsonl. For each freeze it prints the
healthy step rate, the rate while the process was stopped (steps committed during the hold / the hold) and their
ratio against the goal, 0.40; then what the run recorded: samples handed over from stragglers, workers restarted
as stuck, late results and notes dropped, by producer. Exit 1 when a ratio is below the goal. Timing figures depend
on what else runs on the machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import ROOT, add_json_option, run, write_figures
from pcl.loop.runlog import MetricsTail

CONFIG = ROOT / "configs" / "chaos.yaml"
GOAL = 0.40  # the frozen phase keeps at least this share of the healthy step rate
WARM_STEPS = 5  # steps trained before the healthy rate is measured (first calls, the first checkpoint)
# The bench ends the run; the command line may override these. The product's defaults for what decides a worker is
# lost (configs/chaos.yaml shortens them so that its runs restart frozen workers): the visibility timeout, and the
# stuck timeouts, above the hold, so that the frozen phase measures the hand-over alone.
RUN_OVERRIDES = ("run.steps=100000", "control.enabled=false", "logging.backends=[console,jsonl]",
                 "redis.visibility_timeout_s=30", "rollout.stuck_timeout_s=300", "verifier.stuck_timeout_s=120")
COUNTERS = ("handed_over_by_worker", "stuck_restarts_by_worker", "dropped_stale_by_producer",
            "dropped_late_by_verifier", "dropped_duplicates", "dead_letters")


class Run:
    """`pcl train` in a child process, its step records followed as they appear."""

    def __init__(self, config: Path, run_dir: Path, overrides: list[str]):
        self.run_dir = run_dir
        command = [sys.executable, "-m", "entrypoints.cli", "train", str(config), "--run-dir", str(run_dir),
                   *RUN_OVERRIDES, *overrides]
        self.log = open(run_dir.parent / "driver.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.tail = MetricsTail(run_dir / "metrics.jsonl")
        self.commits: list[tuple[float, int]] = []  # (monotonic time seen, step)
        self.last: dict = {}

    def poll(self) -> None:
        """Record the step records written since the last look."""
        now = time.monotonic()
        for record in self.tail.new():  # complete lines only: the run may be writing the last one
            if record.get("effective_ratio") is not None and record["step"] > (self.commits[-1][1] if self.commits
                                                                                 else 0):
                self.commits.append((now, int(record["step"])))
                self.last = record

    def wait(self, seconds: float = 0.0, steps: int = 0) -> None:
        """Follow the run for `seconds`, or until it has committed `steps` steps."""
        deadline = time.monotonic() + seconds
        while (time.monotonic() < deadline if seconds else len(self.commits) < steps):
            if self.process.poll() is not None:
                raise RuntimeError(f"the run ended (exit {self.process.returncode}); see {self.log.name}")
            self.poll()
            time.sleep(0.2)

    def rate(self, start: float, end: float) -> float:
        """Steps committed per second between two moments."""
        return sum(start < t <= end for t, _ in self.commits) / (end - start)

    def pids(self, title: str) -> list[int]:
        import psutil

        root = psutil.Process(self.process.pid)
        return sorted(p.pid for p in root.children(recursive=True) if _title(p.pid).startswith(f"ray::{title}"))

    def stop(self) -> None:
        """SIGINT to the driver (it stops its fleet, Ray and Redis), then SIGKILL of what is left of its group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.wait(timeout=30)
        self.log.close()


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def freeze(job: Run, actor: str, hold_s: float) -> dict:
    """SIGSTOP one process of `actor` for hold_s, then SIGCONT; the step rate while it was stopped."""
    pids = job.pids(actor)
    if not pids:
        raise RuntimeError(f"no ray::{actor} process found")
    pid, start = pids[0], time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        job.wait(seconds=hold_s)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:  # restarted as stuck meanwhile: its process is gone
            pass
    end = time.monotonic()
    return {"actor": actor, "pid": pid, "hold_s": round(end - start, 1), "rate": job.rate(start, end),
            "steps": sum(start < t <= end for t, _ in job.commits), "restarted": not Path(f"/proc/{pid}").exists()}


def measure(args) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="pcl-bench-stragglers-"))  # removed at the end unless --keep
    job = Run(args.config, scratch / "run", args.overrides)
    try:
        job.wait(steps=WARM_STEPS)
        start = job.commits[-1][0]
        job.wait(steps=WARM_STEPS + args.healthy_steps)
        end = job.commits[-1][0]
        healthy = args.healthy_steps / (end - start)
        hold = args.hold or max(60.0, end - start)
        phases = []
        for actor in ("RolloutWorker", "RewardVerifier"):
            phases.append(freeze(job, actor, hold))
            job.wait(seconds=3 / healthy)
        job.poll()
        counters = {key: job.last.get(key) for key in COUNTERS}
    finally:
        job.stop()
    if not args.keep:  # a failure above keeps it: the driver's log says why
        shutil.rmtree(scratch, ignore_errors=True)
    for phase in phases:
        phase["ratio"] = phase["rate"] / healthy if healthy else 0.0
    return {"healthy_rate": healthy, "healthy_s": end - start, "phases": phases, "counters": counters,
            "steps": job.commits[-1][1] if job.commits else 0,
            "run_dir": str(scratch) if args.keep else None}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--hold", type=float, default=None, help="seconds each process stays stopped (default: "
                        "max(60, the seconds the healthy steps took))")
    parser.add_argument("--healthy-steps", type=int, default=10, help="steps the healthy step rate is measured over")
    parser.add_argument("--keep", action="store_true", help="keep the run directory and the driver's log")
    add_json_option(parser)
    args = parser.parse_args(argv)

    figures = measure(args)
    print(f"healthy: {figures['healthy_rate']:.3f} steps/s ({args.healthy_steps} steps in "
          f"{figures['healthy_s']:.0f} s; {args.config.name} {' '.join(args.overrides)})".rstrip())
    ok = True
    for p in figures["phases"]:
        passed = p["ratio"] >= GOAL
        ok &= passed
        print(f"{p['actor']} stopped {p['hold_s']:g} s: {p['rate']:.3f} steps/s ({p['steps']} steps)"
              f"{', restarted as stuck' if p['restarted'] else ''}; ratio to healthy x{p['ratio']:.2f} "
              f"(goal >= {GOAL:.2f}: {'PASS' if passed else 'FAIL'})")
    for key, value in figures["counters"].items():
        print(f"  {key}: {value}")
    figures["exit_code"] = 0 if ok else 1
    return write_figures(args.json, figures)


if __name__ == "__main__":
    run(main)
