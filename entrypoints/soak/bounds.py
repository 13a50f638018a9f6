"""What bounds each file and folder a soak watches, from the config and the settings the run starts Redis and Ray
with, as sentences for the report (`pcl.tools.soak_report.Facts.bounds`), and the report's facts of a config.

    facts = facts_of(cfg)          # pcl.tools.soak_report.Facts
    facts.bounds["checkpoints/"]   # "checkpoint.keep=2 complete checkpoints, and one being written"
"""

from __future__ import annotations

from pcl.config import Config
from pcl.tools.soak_report import Facts


def named_bounds(cfg: Config) -> dict[str, str]:
    """file or folder (of the run directory; `ray:` for the Ray session's) -> the setting that bounds it."""
    import os

    from actors.runtime import RAY_LIMITS
    from services.redis_server import AOF_REWRITE_MIN_MB, AOF_REWRITE_PERCENTAGE

    ray = {key: os.environ.get(key, value) for key, value in RAY_LIMITS.items()}  # what a local Ray starts with
    keep = cfg.checkpoint.keep
    best = ", the best (evaluation.keep_best)" if cfg.evaluation.keep_best and cfg.evaluation.every else ""
    rotation = (f"each file rotated at RAY_ROTATION_MAX_BYTES={int(ray['RAY_ROTATION_MAX_BYTES']) >> 20} MB, "
                f"RAY_ROTATION_BACKUP_COUNT={ray['RAY_ROTATION_BACKUP_COUNT']} kept")
    return {
        "checkpoints/": f"checkpoint.keep={keep} complete checkpoints{best} and one being written, each with the "
                        "step records to its step",
        "checkpoints/#": f"checkpoint.keep={keep}, one being written{best}",
        "events.jsonl": "a line per driver start, restart and Redis outage: none in a quiet run",
        "redis/appendonly.aof": (f"rewritten once past auto-aof-rewrite-min-size {AOF_REWRITE_MIN_MB} MB and grown "
                                 f"{AOF_REWRITE_PERCENTAGE}% since its last rewrite (services/redis_server.py)"),
        "redis/redis.log": "a few lines a start and an AOF rewrite",
        "ray:logs/": rotation,
        "ray:session/": "sockets and runtime resources, set up as Ray starts (its logs: logs/ above); old session "
                        "folders are never removed by Ray",
    }


def ray_rotation() -> tuple[int, int]:
    """(RAY_ROTATION_MAX_BYTES, RAY_ROTATION_BACKUP_COUNT) a local Ray started by `pcl train` runs with: the
    environment's, else RAY_LIMITS' (actors/runtime.py sets them where they are not set)."""
    import os

    from actors.runtime import RAY_LIMITS

    return tuple(int(os.environ.get(key, RAY_LIMITS[key])) for key in ("RAY_ROTATION_MAX_BYTES",
                                                                          "RAY_ROTATION_BACKUP_COUNT"))


def facts_of(cfg: Config) -> Facts:
    """The report's facts of a run config: m, n, the checkpoint settings, the control state's caps, the bounds,
    Ray's log rotation."""
    from services.control.state import EVENTS_MAXLEN, HISTORY_MAXLEN

    max_bytes, backups = ray_rotation()
    return Facts(cfg.run.m, cfg.run.n, cfg.checkpoint.every, cfg.checkpoint.keep, HISTORY_MAXLEN, EVENTS_MAXLEN,
                 named_bounds(cfg), ray_rotation_bytes=max_bytes, ray_rotation_backups=backups)
