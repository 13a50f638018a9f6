"""The invariants of a finished run, from what it left: its records (metrics.jsonl, selections.jsonl, its tracker's
event files) and its Redis. `pcl chaos` checks these at its end, beside what only its own driver saw (the run's
processes, the control traffic); `pcl chaos-check` checks them for a run trained any other way, a deployment's with
its own Redis (`redis.url`, or REDIS_URL) included, whose reading starts no server.

    checks = run_checks(cfg, read_run(cfg, run_dir))      # entrypoints.chaos.final.read_run
    code = check_run(cfg, run_dir)                        # printed; 0 when every check passed
"""

from __future__ import annotations

from pathlib import Path

from pcl.config import Config
from pcl.tools.chaos_checks import (Check, check_batches, check_steps, check_streams, check_trackers,
                                    check_versions)
from pcl.tools.partition_checks import check_incarnations, check_stale_results, expected_instances


def run_checks(cfg: Config, reading) -> list[Check]:
    """steps, batches, versions, trackers and streams (pcl/tools/chaos_checks.py), incarnations and stale results
    (pcl/tools/partition_checks.py) over `reading` (`entrypoints.chaos.final.RunReading`)."""
    steps, m, n = cfg.run.steps, cfg.run.m, cfg.run.n
    checks = [check_steps(reading.metrics, reading.selections, steps),
              check_batches(reading.metrics, reading.selections, m, n),
              check_versions(reading.selections, cfg.run.max_staleness),
              check_trackers(reading.trackers, steps)]
    if reading.streams is None:
        checks += [Check("streams", None, reading.redis_error), Check("incarnations", None, reading.redis_error)]
    else:
        checks.append(check_streams(reading.streams, reading.dead))
        checks.append(check_incarnations(reading.incarnations or [], expected_instances(cfg)))
    checks.append(check_stale_results(reading.metrics, reading.incarnations or []))
    return checks


def check_run(cfg: Config, run_dir: str | Path) -> int:
    """Print the invariants of the finished run in `run_dir` (a skipped check does not pass); 0 when all passed."""
    from entrypoints.chaos.final import read_run
    from services.redis_server import masked

    run_dir = Path(run_dir)
    checks = run_checks(cfg, read_run(cfg, run_dir))
    where = (f"its Redis at {masked(cfg.redis.url)}" if cfg.redis.url
             else f"its embedded Redis' data in {run_dir / 'redis'}")
    print(f"pcl chaos-check: run {cfg.run.name!r} in {run_dir}, {where}")
    for check in checks:
        print(f"  {check.status} {check.name}: {check.detail}")
    passed = all(check.ok is True for check in checks)
    print(f"result: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1
