"""`pcl train`: the driver. It prepares everything before any actor starts (config, model paths, data), then
starts Redis (embedded unless configured) and Ray (local unless RAY_ADDRESS points at a cluster), places the
actors, and follows the coordinator, printing one line per step and a progress bar.

    run_training(load_config("configs/tiny.yaml"), run_dir="runs/demo")
    run_training(cfg, run_dir="runs/demo", resume="")       # continue from the newest complete checkpoint

It also supervises the run: when it fails in a way no actor restart covers (a learner rank, the sampler or
the coordinator lost, a deadline missed), the fleet is stopped and started again from the newest complete
checkpoint, at most `checkpoint.max_restarts` times. Work in flight is discarded (the run's streams are
purged), so every committed step's batch holds each (prompt, sample) exactly once. What interrupted the run
(this driver's start, its restarts, its Redis restarted or unreachable or full) is recorded as windows in
RUN_DIR/events.jsonl (services/run_events.py).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from entrypoints.follow import follow
from entrypoints.guide import next_steps, training_plan
from pcl.config import Config, ConfigError, dump_config, redacted
from pcl.loop.runlog import METRICS_FILE, read_metrics

log = logging.getLogger("pcl.train")


@dataclass
class Prepared:
    """What the driver resolved before starting any actor."""

    run_dir: Path
    policy_path: str
    value_path: str
    train_prompts: list
    eval_prompts: list
    answers: dict
    checkpoint: Path | None = None  # the checkpoint a resumed run starts from
    suite: dict | None = None  # benchmark name -> prompt records, evaluated every evaluation.every steps
    overrides: dict = field(default_factory=dict)  # tunable selection settings the resumed config overrides


def prepare(cfg: Config, run_dir: str | None, resume: str | None) -> Prepared:
    """Everything that can fail on bad input, done before Redis, Ray or any actor starts."""
    from pcl.data.inputs import held_out_prompts, run_inputs, training_prompts
    from pcl.loop.resume import check_resumable
    from pcl.strategies import check_strategy
    from services.tracking.trackers import check_backends

    check_backends(cfg)  # a tracker named but not installed: named with its extra, before anything starts
    try:  # a strategy that does not fit the run fails here, not mid-run
        check_strategy(cfg.selection, cfg.run.m, n=cfg.run.n)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out = Path(run_dir or cfg.run.run_dir or f"runs/{cfg.run.name}")
    checkpoint = None
    if resume is not None:
        import pcl.checkpoint_store as ckpt

        try:
            checkpoint = ckpt.resolve(resume, out)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
        if resume and not run_dir:  # `--resume DIR` names the run: its directory is the checkpoint's run dir
            out = checkpoint.parent.parent
        print(f"pcl: resuming from {checkpoint} (step {ckpt.step_of(checkpoint)})", flush=True)
    elif (out / "metrics.jsonl").exists():
        raise ConfigError(f"run dir {str(out)!r} already holds a run: pass --resume to continue it, "
                          f"or choose another --run-dir")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission
        raise ConfigError(f"run dir {str(out)!r}: cannot create it ({exc.strerror or exc})") from None
    # control.token is a secret: it stays out of the run directory (a resumed run takes it from PCL_API_TOKEN)
    (out / "config.yaml").write_text(dump_config(redacted(cfg, token_mask=None)))  # Redis password masked too

    inputs = run_inputs(cfg)  # model paths and tokenizer; the prompt sets below: pcl.data.inputs
    train, report = training_prompts(cfg, inputs.tokenizer)
    print(f"pcl: training set {cfg.data.source}: {report.summary()}", flush=True)
    if len(train) < cfg.run.m:
        raise ConfigError(f"data.source {cfg.data.source!r}: {len(train)} usable prompts, fewer than run.m={cfg.run.m}")
    evals = []
    if cfg.data.eval_source and cfg.run.evaluates_held_out:
        evals, report = held_out_prompts(cfg, inputs.tokenizer)
        print(f"pcl: held-out set {cfg.data.eval_source}: {report.summary()}", flush=True)
    suite = None
    if cfg.evaluation.suite and cfg.evaluation.every:
        from pcl.benchmarks import load_suite

        try:
            suite = load_suite(list(cfg.evaluation.suite), inputs.tokenizer, cfg.data.template, root=cfg.data.root,
                               limit=cfg.evaluation.limit, max_prompt_tokens=cfg.data.max_prompt_tokens)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"evaluation.suite: {exc}") from None
        print(f"pcl: evaluation suite every {cfg.evaluation.every} steps: "
              + ", ".join(f"{name} ({len(records)})" for name, records in suite.items()), flush=True)
    answers = {p.id: p.answer for p in train}
    answers.update({p.id: p.answer for p in evals})
    for records in (suite or {}).values():
        answers.update({p.id: p.answer for p in records})
    overrides = check_resumable(cfg, checkpoint, train) if checkpoint is not None else {}  # pcl.loop.resume
    return Prepared(out, inputs.policy_path, inputs.value_path, train, evals, answers, checkpoint, suite, overrides)


def recoverable(exc: BaseException) -> bool:
    """Whether a failure of the run is one a restart from the last checkpoint can cure: an actor or object
    lost, a deadline missed, Redis or the network gone for a while. Bugs and bad input are not."""
    import ray.exceptions
    import redis

    from actors.learner import LearnerLost
    from actors.ports import FleetBehind
    from services.streams.queues import QueueUnavailable

    kinds = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.GetTimeoutError,
             ray.exceptions.ActorUnavailableError, LearnerLost, FleetBehind, QueueUnavailable, TimeoutError,
             ConnectionError, redis.ConnectionError, redis.TimeoutError)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kinds):
            return True
        exc = getattr(exc, "cause", None) or exc.__cause__
    return False


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1][:200] if text else ''}"


def finish_run(cfg: Config, run_dir: Path, summary: dict, trackers, store) -> None:
    """The end of a finished run: summary.json, the trackers' last events (from the control `store`, when the run
    has one) and summary, and the report printed (the same as `pcl summary RUN_DIR`)."""
    from pcl.loop.runlog import summarize, summary_report

    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if store is not None:
        trackers.relay(store)
    trackers.finish({**summarize(read_metrics(run_dir / METRICS_FILE)), "restarts": summary["restarts"],
                     "total_seconds": summary["total_seconds"]})
    print(f"pcl: done: {summary['steps']} steps in {summary['total_seconds']:.0f}s\n" + summary_report([run_dir]),
          flush=True)
    print(next_steps(cfg, run_dir), flush=True)


def announce(cfg: Config, prep: Prepared) -> None:
    """The run's opening lines; partial checkpoints of an interrupted write are removed (one driver per run dir:
    none is being written)."""
    import pcl.checkpoint_store as ckpt

    print(f"pcl: run dir {prep.run_dir}  policy {prep.policy_path}  strategy {cfg.selection.type}  "
          f"m={cfg.run.m} n={cfg.run.n}  {len(prep.train_prompts)} train / {len(prep.eval_prompts)} eval prompts",
          flush=True)
    for partial in ckpt.remove_partial(prep.run_dir / "checkpoints"):
        print(f"pcl: removed {partial}, a partial checkpoint of an interrupted write", flush=True)


def open_run_redis(cfg: Config, run_dir: Path):
    """The run's Redis (`redis.url`, else embedded under RUN_DIR/redis); warns when an embedded one meets a Ray
    cluster, whose other hosts cannot reach it."""
    from services.redis_server import open_redis

    redis = open_redis(cfg.redis, run_dir / "redis")
    if redis.embedded and os.environ.get("RAY_ADDRESS"):
        print("pcl: warning: no redis.url / REDIS_URL with a Ray cluster: the embedded Redis listens on this host "
              "only, so actors on other hosts cannot reach it (fine when every node is this machine)",
              file=sys.stderr, flush=True)
    return redis


def logged_records(run_dir: Path) -> list[dict]:
    """Step records already in RUN_DIR/metrics.jsonl (a restored run's, before it goes on)."""
    return read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).exists() else []


def control_snapshot(checkpoint: Path | None) -> dict | None:
    """The control state kept with `checkpoint` (control.json), if any."""
    if checkpoint is not None and (checkpoint / "control.json").is_file():
        return json.loads((checkpoint / "control.json").read_text())
    return None


def driver_control(cfg: Config, prep: Prepared, redis, fresh: bool):
    """The run's control state on its Redis (reset for a fresh run; a resumed one's kept, or taken from the
    checkpoint's snapshot) and, with control.enabled, the control plane serving it (`services.control.server`). A
    fresh run also starts its actors' incarnation registry anew (`services.incarnations`; kept across restarts)."""
    from services.control.server import DriverControl
    from services.incarnations import clear_incarnations

    if fresh:
        clear_incarnations(redis.client(name="driver"), cfg.run.name)

    return DriverControl(cfg, redis.url, prep.run_dir, k_max=len(prep.train_prompts) // cfg.run.m, fresh=fresh,
                         tools_url=redis.tcp_url, snapshot=control_snapshot(prep.checkpoint),
                         overrides=prep.overrides)


def start_from(cfg: Config, run_dir: Path, fleet, checkpoint: Path | None) -> None:
    """A new fleet restores `checkpoint`; a fresh start (or a restart before the first checkpoint) begins with
    empty logs."""
    import ray

    if checkpoint is not None:
        info = ray.get(fleet.coordinator.restore.remote(str(checkpoint)), timeout=cfg.learner.timeout_s)
        print(f"pcl: restored step {info['step']} (policy version {info['policy_version']})", flush=True)
    else:
        fresh_logs(run_dir)


def fresh_logs(run_dir: Path) -> None:
    """A run that starts from step 0 begins with empty metrics and selections."""
    from pcl.loop.runlog import SELECTIONS_FILE, MetricsLog

    MetricsLog(run_dir).truncate_after(-1)
    MetricsLog(run_dir, SELECTIONS_FILE).truncate_after(-1)


def restart_point(cfg: Config, run_dir: Path, exc: BaseException, restarts: int) -> Path | None:
    """The checkpoint a restart after `exc` begins from (None: the start), said on stderr."""
    import pcl.checkpoint_store as ckpt

    checkpoint = ckpt.latest(run_dir / "checkpoints")
    print(f"pcl: the run failed ({_reason(exc)}); restarting from "
          f"{checkpoint or 'the start'} (restart {restarts} of {cfg.checkpoint.max_restarts})",
          file=sys.stderr, flush=True)
    return checkpoint


def keep_and_record(cfg: Config, prep: Prepared, resume: str | None, redis):
    """The run's events (RUN_DIR/events.jsonl, services/run_events.py; a fresh run starts a new file), this
    driver's `driver_start` window opened from the process's start, and the Redis keeper with the driver's probe,
    watching from its thread. Returns (events, the driver_start window's key, the keeper)."""
    import psutil

    from services.redis_keeper import EmbeddedRedisKeeper, RedisProbe
    from services.redis_server import make_client
    from services.run_events import EVENTS_FILE, RunEvents

    if resume is None:
        (prep.run_dir / EVENTS_FILE).unlink(missing_ok=True)
    events = RunEvents(prep.run_dir)
    how = f"resumed from {prep.checkpoint}" if prep.checkpoint is not None else "a fresh start"
    window = events.begin("driver_start", how, start=psutil.Process().create_time())
    probe = RedisProbe(make_client(redis.url, "driver-probe", socket_timeout=5.0), f"pcl:{cfg.run.name}:driver_probe",
                       events)
    # Restarted if it exits, checked every second from a thread (the driver may be starting Ray or the fleet) too.
    return events, window, EmbeddedRedisKeeper(redis, cfg.checkpoint.max_restarts, events, probe).watch()


def failed_run(trackers, control, exc: BaseException) -> None:
    """A run that stopped on an error (or an interrupt): its tracker runs marked failed, and its control plane's
    status (when it has one) says so."""
    trackers.close(failed=True)
    if control is not None:
        control.failed(exc)


def release(trackers, console, fleet, control, own_ray: bool, redis, keep_redis) -> None:
    """Close what a run opened, in this order: trackers, the console sink, the fleet, the control plane, Ray
    (when this process started it), Redis, then its keeper (a server the keeper started stops with its thread)."""
    trackers.close()
    if console is not None:
        console.close()
    if fleet is not None:
        fleet.stop()
    if control is not None:
        control.close()
    if own_ray:
        import ray

        ray.shutdown()
    keep_redis.quiet()
    redis.close()
    keep_redis.stop()


def run_training(cfg: Config, run_dir: str | None = None, resume: str | None = None) -> int:
    """Train to completion; returns the process exit code."""
    from actors.runtime import limit_malloc_arenas

    started = time.perf_counter()
    limit_malloc_arenas()  # before the driver's threads start: its RSS bounded (actors/runtime.py)
    prep = prepare(cfg, run_dir, resume)  # bad input fails here, before the heavy imports below
    from actors.runtime import start_ray
    from entrypoints.fleet import start_fleet
    from services.streams.rollout_client import purge_streams

    announce(cfg, prep)
    from services.tracking.trackers import Trackers

    # the trackers' runs (new, or the resumed run's) open before Redis and the actors: a failure costs nothing
    trackers = Trackers.open(cfg, prep.run_dir, resume=resume is not None, checkpoint=prep.checkpoint)
    console = None if "console" in cfg.logging.backends else open(os.devnull, "w")  # noqa: SIM115
    redis = open_run_redis(cfg, prep.run_dir)
    events, starting, keep_redis = keep_and_record(cfg, prep, resume, redis)  # starting: the window until actors up
    control, own_ray, fleet, kept = None, False, None, None
    checkpoint, restarts, started_again = prep.checkpoint, 0, []
    try:
        # Control state in Redis (reset for a fresh run) and, with control.enabled, the control plane.
        control = driver_control(cfg, prep, redis, fresh=resume is None)
        own_ray = start_ray(cfg.ray)  # the `ray` section: a local Ray's health checks (a cluster's: its nodes')
        while True:
            keep_redis()
            purge_streams(redis.url, cfg.run.name)  # nothing in flight from an earlier attempt is collected
            try:
                attempt, kept = kept, None  # a start that fails removes what it was given: the next starts anew
                survivors = set(attempt.handles.named()) if attempt is not None else None
                fleet = start_fleet(cfg, prep, redis.url, kept=attempt)  # an actor lost here: a restart too
                if survivors is not None:
                    started_again.append(["coordinator"] + sorted(set(fleet.handles.named()) - survivors))
                    print(f"pcl: restart {restarts} kept {len(survivors)} actors, started again: "
                          f"{', '.join(started_again[-1])}", flush=True)
                start_from(cfg, prep.run_dir, fleet, checkpoint)
                logged = logged_records(prep.run_dir)  # read once: the trackers catch up, the follower skips them
                trackers.catch_up(logged)  # a record the last driver wrote and never sent
                print(f"pcl: actors up in {time.perf_counter() - started:.1f}s; {training_plan(cfg)}", flush=True)
                events.end(starting)
                starting = None
                summary = follow(fleet.coordinator.run.remote(), prep.run_dir, cfg.run.steps, stream=console,
                                 seen=len(logged), on_record=trackers.commit,
                                 on_poll=lambda: (keep_redis(), trackers.relay(control.store)))
                break
            except Exception as exc:
                if not recoverable(exc) or restarts >= cfg.checkpoint.max_restarts:
                    raise
                restarts += 1
                if starting is not None:  # a start or a restart that failed before its actors were up
                    events.end(starting)
                starting = events.begin("restart", _reason(exc))
                checkpoint = restart_point(cfg, prep.run_dir, exc, restarts)
                if fleet is not None and checkpoint is not None:
                    kept = fleet.salvage(cfg)  # what survived is restored from the checkpoint like new actors
                elif fleet is not None:
                    fleet.stop()  # from the start: every actor new (the survivors hold trained state)
                fleet = None
        summary.update(restarts=restarts, redis_restarts=keep_redis.restarts, started_again=started_again,
                       total_seconds=time.perf_counter() - started)
        finish_run(cfg, prep.run_dir, summary, trackers, control.store)
        return 0
    except BaseException as exc:
        failed_run(trackers, control, exc)
        raise
    finally:
        release(trackers, console, fleet, control, own_ray, redis, keep_redis)
