"""`pcl soak CONFIG --minutes M`: a real training run for a set time under steady control-plane traffic, sampled
from outside every few seconds, then a report of what grew (docs/operations.md, "Long runs").

    run_soak("configs/soak.yaml", [], minutes=60)          # exit status 0: nothing grows beyond its goal
    run_soak("configs/soak.yaml", ["rollout.engine=vllm"], minutes=20, out="runs/soak-vllm")

`pcl train` runs as a child process (`entrypoints.chaos.driver.Driver`: its output, its milestones) with
run.train_budget_s = the minutes, so it stops cleanly by itself; `traffic.py` polls and steers its control plane;
`sampler.py` samples every process of the run, its Redis, its files and its Ray session; the samples go, line by
line, to OUT/samples.jsonl. The report (`pcl.tools.soak_report`: slopes, intervals, projections, verdicts) is
printed and written to OUT/soak_report.txt and .json, the plots (`plots.py`) to OUT/soak.png. Output in OUT
(default runs/soak-<run.name>-<time>): run/ (the run directory), run-driver.log, samples.jsonl, soak_run.json,
the report. `pcl soak CONFIG --report-only --out OUT` builds the report again from what OUT holds.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from pathlib import Path

from pcl.config import Config, ConfigError, ENV_FALLBACKS, load_config

SAMPLE_S = 15.0  # seconds between two samples
RUN_FILE = "soak_run.json"  # how the run ended, the control traffic's answers, processes left
START_ALLOWANCE_S = 900.0  # the run's start (Ray, the actors, the first evaluation) and its end, beyond the minutes


def soak_config(config_files: list[str], overrides: list[str], minutes: float) -> tuple[Config, list[str]]:
    """The run's config with run.train_budget_s = the minutes (and no wall-clock budget); refused when a soak cannot
    follow it: no control plane, or a step count that would end the run early (the run must still be training
    when its minutes are up)."""
    overrides = [*overrides, f"run.train_budget_s={minutes * 60:g}", "run.time_budget_s=null"]
    cfg = load_config(config_files, overrides)
    if not cfg.control.enabled:
        raise ConfigError("pcl soak polls the control plane: control.enabled must be true")
    if cfg.run.steps < 10 * minutes * 60:  # a step in under 0.1 s: far faster than any real run
        raise ConfigError(f"run.steps={cfg.run.steps} may end the run before its {minutes:g} minutes: set "
                          f"run.steps >= {int(10 * minutes * 60)} (pcl soak stops it by run.train_budget_s)")
    return cfg, overrides


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_soak(config: str, overrides: list[str], minutes: float, out: str | None = None,
             sample_s: float = SAMPLE_S, warmup_s: float | None = None) -> int:
    """The whole soak; returns 0 when every judged series is within its goal, else 1."""
    from entrypoints.chaos.driver import Driver, train_command
    from entrypoints.chaos.procs import ProcessTree
    from entrypoints.soak.sampler import Sampler
    from entrypoints.soak.traffic import SteadyTraffic
    from pcl.loop.runlog import METRICS_FILE

    if minutes <= 0 or sample_s <= 0:
        raise ConfigError(f"--minutes ({minutes:g}) and --sample-seconds ({sample_s:g}) must be positive")
    files = [config] + [a for a in overrides if "=" not in a]
    cfg, overrides = soak_config(files, [a for a in overrides if "=" in a], minutes)
    root = Path(out or f"runs/soak-{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if (root / "run").exists():
        raise ConfigError(f"{root / 'run'} exists: a soak needs a new --out directory")
    root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    env = {**os.environ, ENV_FALLBACKS["control.token"]: token, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    clock = lambda: time.monotonic() - started  # noqa: E731
    tree = ProcessTree()
    driver = Driver(train_command(files, [*overrides, f"control.port={_free_port()}"]), root / "run", env,
                    root / "run-driver.log", clock, on_start=lambda process: tree.owned.add(process.pid), tag="soak")
    sampler = Sampler(tree, root / "run", cfg.run.name, driver_pid=lambda: driver.pid, metrics_file=METRICS_FILE,
                      extra_files={"run-driver.log": root / "run-driver.log"})
    traffic = SteadyTraffic(lambda: driver.control_url if driver.state == "up" else None, token,
                            tau=getattr(cfg.selection, "tau", None))
    print(f"pcl soak: {minutes:g} minutes of training, a sample every {sample_s:g} s; output in {root}", flush=True)
    driver.start()
    code = None
    try:
        code = follow(driver, sampler, traffic, root / "samples.jsonl", sample_s,
                      deadline_s=minutes * 60 + START_ALLOWANCE_S, clock=clock)
    finally:
        traffic.stop()
        if driver.poll() is None:
            driver.stop()
        leftovers = tree.wait_gone(30.0)
        tree.kill_all()
        driver.close()
    return report(cfg, root, code, driver, traffic, leftovers, minutes, warmup_s)


def follow(driver, sampler, traffic, samples_path: Path, sample_s: float, deadline_s: float, clock) -> int | None:
    """Sample every `sample_s` until the driver exits (its exit status) or the deadline passes (None). Times count
    from the run's first `actors up`; samples before it are kept with a negative time."""
    t0, next_at = None, 0.0
    with open(samples_path, "a", encoding="utf-8") as out:
        while True:
            now = clock()
            if t0 is None and driver.state == "up":
                t0 = now
                traffic.start()
            code = driver.poll()
            if code is not None:
                return code
            if now >= deadline_s:
                return None
            if now >= next_at:
                next_at = now + sample_s
                step = sampler.steps()
                state = driver.state  # "up" while training: the report judges those samples only
                sample = sampler.sample(now - (t0 if t0 is not None else now + 1), step,
                                        driver.control_url if state == "up" else None)
                sample["state"] = state
                out.write(json.dumps(sample) + "\n")
                out.flush()
            time.sleep(0.2)


def read_samples(path: Path) -> list[dict]:
    """The samples of a soak (OUT/samples.jsonl), a torn last line left out."""
    samples = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return samples


def report(cfg: Config, root: Path, code: int | None, driver, traffic, leftovers, minutes: float,
           warmup_s: float | None) -> int:
    """Record how the run went (OUT/soak_run.json), then build, print and write the report; 0 when it passed."""
    ended = ("finished" if code == 0 else f"pcl train exited with status {code}" if code is not None
             else "did not end in time: stopped")
    run = {"ended": ended, "minutes": minutes, "traffic": traffic.summary(), "driver_tail": list(driver.tail),
           "leftover_processes": [f"{pid} {title[:80]}" for pid, title in leftovers]}
    (root / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")
    return write_report(cfg, root, run, warmup_s)


def report_again(config: str, overrides: list[str], out: str | None, warmup_s: float | None) -> int:
    """`pcl soak CONFIG --report-only --out OUT`: the report of a soak already run, from OUT/samples.jsonl and
    OUT/soak_run.json (another warm-up, a report after an interruption)."""
    if not out:
        raise ConfigError("pcl soak --report-only needs --out: the soak's output directory")
    root = Path(out)
    if not (root / "samples.jsonl").is_file():
        raise ConfigError(f"{root / 'samples.jsonl'}: no samples there (pcl soak --report-only --out OUT)")
    files = [config] + [a for a in overrides if "=" not in a]
    cfg = load_config(files, [a for a in overrides if "=" in a])
    run = json.loads((root / RUN_FILE).read_text()) if (root / RUN_FILE).is_file() else {"ended": "unknown"}
    return write_report(cfg, root, run, warmup_s)


def write_report(cfg: Config, root: Path, run: dict, warmup_s: float | None) -> int:
    """Build, print and write the report (text, JSON, PNG); 0 when it passed."""
    from entrypoints.soak.plots import plot_samples
    from entrypoints.soak.bounds import facts_of
    from pcl.tools.soak_report import build_report
    from pcl.tools.soak_text import format_report

    samples = read_samples(root / "samples.jsonl")
    result = build_report(samples, facts_of(cfg), run, warmup_s=warmup_s)
    text = format_report(result)
    print(text, flush=True)
    (root / "soak_report.txt").write_text(text + "\n")
    (root / "soak_report.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    try:
        print(f"pcl soak: plots in {plot_samples(samples, result, root / 'soak.png')}", flush=True)
    except ImportError as exc:  # matplotlib is the experiment extra's
        print(f"pcl soak: no plots ({exc})", flush=True)
    return 0 if result["passed"] else 1
