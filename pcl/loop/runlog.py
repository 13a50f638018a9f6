"""The run directory's per-step record: `RUN_DIR/metrics.jsonl`, one JSON object per step.

A line is a step record (`pcl.loop.record.StepRecord.to_dict`: its keys are the record's fields). The coordinator
appends one line per committed step (flushed and fsynced, so a killed run keeps every step it
finished); the driver tails the same file to print one console line per step. Non-finite floats are written as
null so every line is strict JSON.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterator

import pcl.checkpoint_store as ckpt
from pcl.loop.record import STEP_KEYS, StepRecord  # noqa: F401 - STEP_KEYS: the keys every training step carries

METRICS_FILE = "metrics.jsonl"
# the prompts each step trained on and the sample indices of each: {"step": s, "ids": [...], "samples": [[0, ...]]}
SELECTIONS_FILE = "selections.jsonl"



def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _clean(value.item())
    return value


class MetricsLog:
    """Append-only JSONL of step records in a run directory (metrics.jsonl, or another file of step records)."""

    def __init__(self, run_dir: str | os.PathLike, filename: str = METRICS_FILE):
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: StepRecord | dict) -> None:
        if isinstance(record, StepRecord):
            record = record.to_dict()
        line = json.dumps(_clean(record), sort_keys=False, allow_nan=False)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (a resumed run rewrites what came after its checkpoint)."""
        if not self.path.exists():
            return
        kept = [r for r in read_metrics(self.path) if r.get("step", -1) <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, self.path)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All complete records of a metrics file (a torn last line from a crash is ignored)."""
    return list(iter_metrics(path))


def read_records(path: str | os.PathLike) -> list[StepRecord]:
    """The step records of a metrics file, typed (`read_metrics`, each line through `StepRecord.from_dict`)."""
    return [StepRecord.from_dict(r) for r in iter_metrics(path)]


def iter_metrics(path: str | os.PathLike, offset: int = 0) -> Iterator[dict]:
    p = Path(path)
    if not p.exists():
        return
    with open(p, encoding="utf-8") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


class MetricsTail:
    """The records appended to a metrics file since the last look, read on from where that look stopped: a driver
    following a run for days reads each line once, not the whole file every second.

        tail = MetricsTail(run_dir / METRICS_FILE, skip=seen)    # the first `seen` records are not new
        for record in tail.new(): ...
    """

    def __init__(self, path: str | os.PathLike, skip: int = 0):
        self.path, self.skip, self.offset = Path(path), skip, 0

    def new(self) -> list[dict]:
        """Complete records appended since the last call (a torn last line waits for its end)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in chunk[:end].splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if self.skip:
                self.skip -= 1
            else:
                records.append(record)
        return records


def format_step_line(r: dict, total_steps: int) -> str:
    """One console line per step: the numbers a user watches."""

    def f(key: str, fmt: str) -> str:
        v = r.get(key)
        return "-" if v is None else format(v, fmt)

    line = (f"step {r['step']:>4}/{total_steps}  reward {f('train_reward_mean', '.3f')}  "
            f"eff {f('effective_ratio', '.2f')}  V_sel {f('selected_value_mean', '.2f')}  "
            f"EV {f('value_explained_variance', '+.2f')}  gen {f('generation_seconds', '.2f')}s  "
            f"sel {f('selection_seconds', '.2f')}s  train {f('train_seconds', '.2f')}s  "
            f"sync {f('weight_sync_seconds', '.2f')}s  step {f('step_seconds', '.2f')}s")
    if r.get("policy_skipped"):  # the weights did not change: say so where the user looks
        line += (f"  policy step SKIPPED (loss {f('policy_loss', '.3g')}, grad norm {f('grad_norm', '.3g')}: "
                 f"not finite; {r.get('policy_skipped_steps_total', '?')} skipped so far)")
    if r.get("curriculum_stalled") == 1:  # the step the curriculum stopped paying: say so, and what to change
        line += (f"  CURRICULUM NOT PAYING (gain over uniform {f('curriculum_gain', '+.3f')} for "
                 f"curriculum.patience steps): raise k, move tau, or switch selection.type")
    if r.get("eval_accuracy") is not None:
        line += f"  eval_acc {r['eval_accuracy']:.3f}" + _se(r.get("eval_accuracy_se"))
    if r.get("suite_average") is not None:
        scores = " ".join(f"{k[6:]} {v:.3f}" for k, v in r.items() if k.startswith("suite_") and k != "suite_average")
        line += f"  suite {r['suite_average']:.3f} ({scores})"
    return line


def _se(se: float | None) -> str:
    """" ± 0.012" after a figure whose standard error is known, else nothing."""
    return "" if se is None else f" ± {se:.3f}"


def summarize(records: list[dict]) -> dict:
    """A run's headline figures from its metrics records: held-out accuracy at step 0, at the end and at
    best, with the standard errors of the first and last evaluations (and of the gain between them, the two
    evaluations taken as independent) where the records carry them; mean effective ratio; V's explained variance
    (mean over the second half of training, where V has had time to learn); mean step and generation seconds;
    the curriculum's gain over uniform selection (mean over the second half) and the steps spent stalled (a run
    whose strategy uses V); the run's wall-clock and training seconds."""
    import statistics

    evaluated = [r for r in records if r.get("eval_accuracy") is not None]
    evals = [(r["step"], r["eval_accuracy"]) for r in evaluated]
    steps = [r for r in records if "effective_ratio" in r]
    half = steps[len(steps) // 2:]

    def mean(rows: list[dict], key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    out = {
        "steps": steps[-1]["step"] if steps else 0,
        "eval_accuracy_start": evals[0][1] if evals else None,
        "eval_accuracy_final": evals[-1][1] if evals else None,
        "eval_accuracy_best": max(a for _, a in evals) if evals else None,
        "eval_accuracy_se_start": evaluated[0].get("eval_accuracy_se") if evals else None,
        "eval_accuracy_se_final": evaluated[-1].get("eval_accuracy_se") if evals else None,
        "effective_ratio_mean": mean(steps, "effective_ratio"),
        "value_explained_variance_late": mean(half, "value_explained_variance"),
        "step_seconds_mean": mean(steps, "step_seconds"),
        "generation_seconds_mean": mean(steps, "generation_seconds"),
        "selection_seconds_mean": mean(steps, "selection_seconds"),
        "train_seconds_mean": mean(steps, "train_seconds"),
        "weight_sync_seconds_mean": mean(steps, "weight_sync_seconds"),
        "curriculum_gain_late": mean(half, "curriculum_gain"),
        "curriculum_stalled_steps": sum(bool(r.get("curriculum_stalled")) for r in steps) if any(
            "curriculum_gain" in r for r in steps) else None,
        "elapsed_seconds": steps[-1].get("elapsed_seconds") if steps else None,
        "train_elapsed_seconds": steps[-1].get("train_elapsed_seconds") if steps else None,
    }
    if evals:
        out["eval_gain_points"] = 100 * (out["eval_accuracy_final"] - out["eval_accuracy_start"])
        if out["eval_accuracy_se_start"] is not None and out["eval_accuracy_se_final"] is not None:
            out["eval_gain_se_points"] = 100 * math.hypot(out["eval_accuracy_se_start"], out["eval_accuracy_se_final"])
    return out


def summary_report(run_dirs: list[str | os.PathLike]) -> str:
    """`pcl summary`'s text: the figures of `summarize` side by side, one column per run, then for each run its
    held-out accuracy in words, its step time split and where its checkpoints and metrics are. A run directory
    without metrics.jsonl raises FileNotFoundError."""
    rows = []
    for run in run_dirs:
        path = Path(run) / METRICS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{run}: no {METRICS_FILE} here")
        rows.append((str(run), summarize(read_metrics(path))))
    keys = list(rows[0][1])
    width = max(len(k) for k in keys)
    lines = [" " * width + "".join(f"  {Path(r).name[-24:]:>24}" for r, _ in rows)]  # full paths below
    for k in keys:
        cells = "".join(f"  {'-' if s.get(k) is None else format(s[k], '.3f'):>24}" for _, s in rows)
        lines.append(f"{k:<{width}}{cells}")
    for run, s in rows:
        lines.append(f"{run}:")
        if s.get("eval_accuracy_start") is not None:
            gain_se = s.get("eval_gain_se_points")
            lines.append(f"  held-out accuracy {s['eval_accuracy_start']:.3f}{_se(s['eval_accuracy_se_start'])} -> "
                         f"{s['eval_accuracy_final']:.3f}{_se(s['eval_accuracy_se_final'])} "
                         f"(best {s['eval_accuracy_best']:.3f}), {s['eval_gain_points']:+.1f}"
                         f"{'' if gain_se is None else f' ± {gain_se:.1f}'} points")
        split = [(name, s.get(f"{name}_seconds_mean")) for name in ("selection", "generation", "train", "weight_sync")]
        if s.get("step_seconds_mean"):
            lines.append(f"  {s['step_seconds_mean']:.2f} s/step: " + ", ".join(
                f"{name} {v:.2f}s ({100 * v / s['step_seconds_mean']:.0f}%)" for name, v in split if v is not None))
        if s.get("curriculum_stalled_steps") is not None:  # a run whose strategy uses V
            gain = s.get("curriculum_gain_late")
            lines.append("  curriculum: " + ("" if gain is None else f"gain over uniform selection {gain:+.3f} "
                                             "(effective ratio, second half); ")
                         + f"{s['curriculum_stalled_steps']} of {s['steps']} steps stalled (gain below "
                         "curriculum.min_gain for curriculum.patience steps)")
        newest = ckpt.latest(Path(run) / "checkpoints")
        lines.append(f"  metrics {Path(run) / METRICS_FILE}; checkpoint {newest or 'none'}")
    return "\n".join(lines)
