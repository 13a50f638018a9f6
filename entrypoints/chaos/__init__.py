"""`pcl chaos CONFIG --seed S --faults N`: a training run under a seeded schedule of faults, with control-plane
traffic throughout, and the invariants checked at its end (docs/operations.md, "Chaos runs").

    run_chaos("configs/chaos.yaml", [], seed=0, faults=12)                  # exit status 0: every invariant held
    run_chaos("configs/chaos.yaml", ["run.steps=12"], seed=1, faults=3, window_s=40, reference=True)

The faults are drawn over a window that fits the run (`default_window`: a share of run.steps x the seconds a step
takes, measured by an earlier reference run in OUT/reference, given as step_s, or STEP_S), so that none is drawn
after the run has ended; one that still could not be injected because the run ended is reported as such.

The schedule, the invariants and the report are pure (`pcl/tools/chaos_schedule.py`, `chaos_checks.py`,
`chaos_report.py`); this package drives them: `session.py` runs `pcl train` as a child process and follows it,
`faults.py` injects, `traffic.py` talks to the control plane, `final.py` reads what the run left, `check.py` checks
it (alone: `pcl chaos-check`, for a run trained elsewhere, with its own Redis), `reference.py` trains and compares
the unfaulted reference. Output in OUT (default runs/chaos-<run.name>-seed<S>): run/ (the run
directory, with chaos_report.txt and .json), run-driver.log, requests.jsonl (the control traffic, with what each
request expected), schedule.json, and with --reference, reference/.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path

from pcl.config import Config, ConfigError, ENV_FALLBACKS, load_config
from pcl.tools.chaos_checks import MALFORMED_MARK, Check, check_accuracy, check_control, check_processes, check_weights
from pcl.tools.chaos_report import build_report, commit_times, format_report, recover, steps_redone
from pcl.tools.partition_checks import check_freezes
from pcl.tools.chaos_schedule import (MIN_KINDS, WINDOW_SHARE, Schedule, check_schedule, draw_schedule, fit_window,
                                      seconds_per_step)

# Seconds a step of configs/chaos.yaml takes unfaulted on the 2-core machine, on the low side (seed 2's references
# of 40 steps: 2.3 s alone, 3.4 s beside another test run): the default window's pace when no reference measured it.
STEP_S = 2.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chaos_config(config_files: list[str], overrides: list[str], seed: int) -> tuple[Config, list[str]]:
    """The run's config (seed S as run.seed) and the overrides that make it; refused when it cannot be run
    under chaos: an external Redis (the chaos run kills and fills the embedded one), no append-only persistence
    (the embedded server saves no snapshot: without its AOF, a Redis restart loses the streams, and the final
    reading of the run's Redis finds an empty database), no control plane, or a time budget (the run must train
    its fixed step count)."""
    overrides = [*overrides, f"run.seed={seed}"]
    cfg = load_config(config_files, overrides)
    if cfg.redis.url:
        raise ConfigError("pcl chaos runs the embedded Redis (its faults kill and fill it): unset redis.url (and "
                          "REDIS_URL); `pcl chaos-check` checks a finished run that used its own Redis")
    if not cfg.redis.appendonly:
        raise ConfigError("pcl chaos needs the embedded Redis' append-only file (its only persistence: a restart "
                          "without it loses the streams, and the final checks would read an empty database): "
                          "set redis.appendonly=true")
    if not cfg.control.enabled:
        raise ConfigError("pcl chaos talks to the control plane: control.enabled must be true")
    if cfg.run.time_budget_s or cfg.run.train_budget_s:
        raise ConfigError("pcl chaos needs a fixed step count: set run.time_budget_s=null and run.train_budget_s=null")
    return cfg, overrides


def default_window(cfg: Config, root: Path, step_s: float | None = None) -> tuple[float, str]:
    """The window that fits the run, and how it was found: WINDOW_SHARE of run.steps x the seconds a step takes,
    given (`step_s`), else measured from an unfaulted reference run in ROOT/reference, else STEP_S."""
    from entrypoints.chaos.final import read_records

    source = "--step-seconds"
    if step_s is None:
        step_s, source = seconds_per_step(read_records(root / "reference")[0]), f"measured by {root / 'reference'}"
    if step_s is None:
        step_s, source = STEP_S, "the estimate for configs/chaos.yaml"
    return fit_window(cfg.run.steps, step_s), (f"{WINDOW_SHARE:g} x {cfg.run.steps} steps x {step_s:.2f} s a step "
                                               f"({source})")


def run_chaos(config: str, overrides: list[str], seed: int, faults: int, window_s: float | None = None,
              out: str | None = None, reference: bool = False, timeout_s: float | None = None,
              step_s: float | None = None) -> int:
    """The whole chaos run; returns 0 when the run finished and every invariant held, else 1."""
    from entrypoints.chaos.driver import train_command
    from entrypoints.chaos.procs import ProcessTree
    from entrypoints.chaos.session import ChaosRun

    files = [config] + [a for a in overrides if "=" not in a]
    cfg, overrides = chaos_config(files, [a for a in overrides if "=" in a], seed)
    root = Path(out or f"runs/chaos-{cfg.run.name}-seed{seed}")
    if (root / "run").exists():
        raise ConfigError(f"{root / 'run'} exists: a chaos run needs a new --out directory")
    window_s, window_why = (window_s, "--window") if window_s else default_window(cfg, root, step_s)
    schedule = draw_schedule(seed, faults, window_s)
    problems = check_schedule(schedule, faults, min_kinds=min(faults, MIN_KINDS))
    if faults >= 12 and problems:
        raise ConfigError("the schedule breaks its rules: " + "; ".join(problems))
    root.mkdir(parents=True, exist_ok=True)
    (root / "schedule.json").write_text(schedule.to_json())
    token = secrets.token_urlsafe(32)
    env = {**os.environ, ENV_FALLBACKS["control.token"]: token, "PYTHONUNBUFFERED": "1"}
    port = _free_port()  # fixed, so that a resumed driver serves where the traffic goes
    tree = ProcessTree()
    run = ChaosRun(train_command(files, [*overrides, f"control.port={port}"]), root / "run", env, cfg.run.name, tree)
    replay = (f"pcl chaos {' '.join(files)} --seed {seed} --faults {faults} --window {window_s:g}"
              + "".join(f" {o}" for o in overrides if not o.startswith("run.seed=")) + " --reference" * reference)
    print(f"pcl chaos: {len(schedule.faults)} faults of {len(schedule.kinds)} kinds over {window_s:g} s "
          f"({window_why}); run in {root / 'run'}; replay: {replay}", flush=True)
    try:
        run.go(schedule, token, deadline_s=timeout_s or 2 * window_s + 1200)
        checks = final_checks(cfg, run, tree)
    finally:
        tree.kill_all()
    if reference:
        checks += reference_checks(cfg, files, overrides, run, root, env, token, tree)
    return report(schedule, run, checks, replay)


def final_checks(cfg: Config, run, tree) -> list[Check]:
    """The invariants over what the run left: its processes, then its records and Redis (`run_checks`, which
    `pcl chaos-check` runs alone on any finished run) and the control traffic."""
    from entrypoints.chaos.check import run_checks
    from entrypoints.chaos.final import read_requests, read_run, read_run_events

    leftovers = tree.wait_gone(30.0)
    checks = [check_processes([f"{pid} {title[:80]}" for pid, title in leftovers], seen=len(tree.seen))]
    tree.kill_all()
    reading = read_run(cfg, run.run_dir)
    checks += run_checks(cfg, reading)
    note_dead_letters(run.injector.results if run.injector else [], reading.dead)
    checks.append(check_control(read_requests(run.requests_path), read_run_events(run.run_dir)))
    return checks


def note_dead_letters(results: list[dict], dead: list[dict]) -> None:
    """Add to each malformed-entry fault how many of its entries the run dead-lettered (the others were trimmed
    with a committed step's stream, or purged by a restart, before a consumer read them)."""
    for result in results:
        if result["kind"] == "malformed" and result.get("injected_s") is not None:
            mark = MALFORMED_MARK + f":{result['index']}:".encode()
            found = sorted(d["stream"] for d in dead if mark in bytes(d["payload"]))
            result["note"] += f"; dead-lettered: {', '.join(found) or 'none'}"


def reference_checks(cfg: Config, files: list[str], overrides: list[str], run, root: Path, env: dict, token: str,
                     tree) -> list[Check]:
    """Train the unfaulted reference (the chaos run's control changes replayed at the same steps) and compare:
    weight for weight with rollout.deterministic, else the final held-out accuracy."""
    from entrypoints.chaos.driver import train_command
    from entrypoints.chaos.final import read_records
    from entrypoints.chaos.reference import final_accuracy, param_changes, run_reference, weights_diff

    if not run.finished:
        return [Check("weights", None, "the chaos run did not finish: no reference run")]
    tau, k = getattr(cfg.selection, "tau", None), getattr(cfg.selection, "k", None)
    changes = param_changes(read_records(run.run_dir)[0], tau, k)
    port = _free_port()
    print(f"pcl chaos: training the reference in {root / 'reference'} (control changes replayed: {changes})",
          flush=True)
    tree.forget()
    code, note = run_reference(train_command(files, [*overrides, f"control.port={port}"]), root / "reference", env,
                               token, port, changes, root / "reference-driver.log", timeout_s=3600.0)
    tree.kill_all()
    why = note or (f"the reference run exited with status {code} (log {root / 'reference-driver.log'})" if code
                   else "")
    if why:
        return [Check("weights" if cfg.rollout.deterministic else "accuracy", False, why)]
    if not cfg.rollout.deterministic:
        return [check_accuracy(final_accuracy(run.run_dir), final_accuracy(root / "reference"))]
    try:
        return [check_weights(weights_diff(run.run_dir, root / "reference", cfg.run.steps))]
    except OSError as exc:  # a final checkpoint missing
        return [Check("weights", False, f"cannot compare the final weights: {exc}")]


def report(schedule: Schedule, run, checks: list[Check], replay: str) -> int:
    """Print the report and write it (text and JSON) into the run directory; 0 when it passed."""
    faults = recover(run.injector.results if run.injector else [], commit_times(run.timeline), run.finished_at)
    if any(f.kind == "freeze" for f in schedule.faults):  # liveness: a frozen worker did not freeze the run
        checks = [*checks, check_freezes(faults, run.timeline)]
    steps = max((s for what, _, s in run.timeline if what == "commit"), default=0)
    seconds = run.finished_at if run.finished_at is not None else run.since_t0(run.clock())
    summary = {"finished": run.finished, "error": run.error, "steps": steps, "seconds": seconds,
               "restarts": run.driver.restarts, "resumes": run.resumes,
               "started_again": run.driver.started_again}
    result = build_report(schedule, faults, checks, summary, steps_redone(run.timeline), replay)
    text = format_report(result, schedule)
    print(text, flush=True)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "chaos_report.txt").write_text(text + "\n")
    (run.run_dir / "chaos_report.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0 if result["passed"] else 1

