"""What the driver of `pcl train` shows while the coordinator trains: each step record as a line, as the
coordinator writes it to RUN_DIR/metrics.jsonl, with a progress bar and the coordinator's long tasks.

    summary = follow(coordinator.run.remote(), run_dir, cfg.run.steps, on_record=trackers.log)
"""

from __future__ import annotations

import sys
from pathlib import Path

from pcl.loop.runlog import METRICS_FILE


def follow(coordinator_ref, run_dir: Path, total_steps: int, stream=None, seen: int = 0, on_record=None,
           on_poll=None) -> dict:
    """Print each new metrics line as the coordinator writes it (after the first `seen`), with a progress bar,
    until it finishes; each new record goes to `on_record(record)` too, and `on_poll()` runs every second."""
    stream = stream or sys.stdout  # looked up now: sys.stdout may have been replaced since import
    import ray
    from tqdm import tqdm

    from pcl.progress import TaskProgress
    from pcl.loop.runlog import MetricsTail

    result = None
    tail = MetricsTail(run_dir / METRICS_FILE, skip=seen)  # each line read once, however long the run
    bar = tqdm(total=total_steps, unit="step", file=sys.stderr, dynamic_ncols=True, leave=False,
               disable=not sys.stderr.isatty())
    task = TaskProgress(run_dir, stream)  # the coordinator's long tasks: reference pass, evaluation
    try:
        while result is None:
            done, _ = ray.wait([coordinator_ref], timeout=1.0)
            if done:
                result = ray.get(coordinator_ref)
            records = tail.new()
            task.poll()
            if on_poll is not None:
                on_poll()
            for r in records:
                if on_record is not None:
                    on_record(r)
                line = record_line(r, total_steps)
                if line is not None:
                    tqdm.write(line, file=stream)
                if "effective_ratio" in r:
                    bar.n = r["step"]
                    bar.refresh()
    finally:
        task.close()
        bar.close()
    return result


def record_line(record: dict, total_steps: int) -> str | None:
    """What the driver prints for a metrics record: a training step's line, or the step-0 evaluation's."""
    from pcl.loop.runlog import format_step_line

    if "effective_ratio" in record:
        return format_step_line(record, total_steps)
    if record.get("eval_accuracy") is not None:
        se = record.get("eval_accuracy_se")
        return (f"step {record['step']:>4}/{total_steps}  eval_acc {record['eval_accuracy']:.3f}"
                + ("" if se is None else f" ± {se:.3f}"))
    return None
