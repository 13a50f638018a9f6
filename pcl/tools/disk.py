"""The disk a run writes over its whole length, from its config: what `pcl plan` prints next to GPU memory, and
checks against `cluster.disk_gb` (a run that would need more is refused like one that does not fit its GPUs).

    disk = disk_plan(cfg, policy_shape, value_shape)    # shapes: pcl.tools.shapes.model_shape
    disk.total, disk.lines()                            # bytes; one line per part

Counted for run.steps steps, in the run directory (GB here are 10^9 bytes):
- checkpoints: at most checkpoint.keep complete ones, one more being written before the oldest is removed, and
  the best one with evaluation.keep_best. Each holds the policy in Hugging Face format (model.dtype) and its
  float32 weights and AdamW moments (12 bytes a parameter: learner.pt), V's backbone and head in float32 with the
  same 12 bytes (value/, when the strategy uses V), and a copy of the step records up to its step;
- the step records: metrics.jsonl, selections.jsonl (a prompt id and the sample indices and versions of each of
  m x n samples), the tracker's event files (TensorBoard's; the others keep theirs outside the run directory or
  on their server), and the driver's output, a line a step, wherever it is sent;
- the embedded Redis' append-only file (redis.url unset): Redis rewrites it once it has passed
  auto-aof-rewrite-min-size and doubled since its last rewrite, so it stays under twice the larger of that size
  and Redis' data: at the most a step's rollouts (each sample's prompt as 4-byte token ids, its response as token
  ids, float32 log-probabilities and text, about 12 bytes a token, all at their longest) and the control history
  (HISTORY_BYTES_PER_STEP a record, at most HISTORY_CAP records).
Ray's logs are on each node's /tmp/ray, not in the run directory: rotated at RAY_ROTATION_MAX_BYTES with
RAY_ROTATION_BACKUP_COUNT kept (actors/runtime.py sets both for a local Ray; docs/operations.md, "Long runs").

The bytes a step of each record were measured by `pcl soak configs/soak.yaml` on the tiny task (m=64, n=8) with the
step record as it was at the commit named in docs/operations.md, "Long runs"; selections scale with m x n.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pcl.config import Config
    from pcl.tools.shapes import ModelShape

GB = 1e9
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
OPTIMIZER_BYTES = 12  # float32 weights + AdamW's two moments, a parameter
METRICS_BYTES_PER_STEP = 1_500  # a line of metrics.jsonl
SELECTION_BYTES_PER_SAMPLE = 10  # a line of selections.jsonl, per sample of the step (m x n)
TENSORBOARD_BYTES_PER_STEP = 2_800  # TensorBoard's event file
DRIVER_OUTPUT_BYTES_PER_STEP = 200  # the driver's line a step
HISTORY_BYTES_PER_STEP = 1_600  # a record of the control history in Redis (its AOF holds it too)
HISTORY_CAP = 50_000  # records (services/control/state.py HISTORY_MAXLEN)
PROMPT_TOKEN_BYTES, RESPONSE_TOKEN_BYTES = 4, 12  # a rollout in Redis: uint32 ids; ids, float32 log p and text
AOF_REWRITE_MIN_BYTES = 64 << 20  # services/redis_server.py: auto-aof-rewrite-min-size


@dataclass
class DiskPlan:
    steps: int
    parts: dict[str, float] = field(default_factory=dict)  # name -> bytes at the most
    notes: dict[str, str] = field(default_factory=dict)  # name -> how it was counted

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def lines(self) -> list[str]:
        out = [f"disk for {self.steps:,} steps (the run directory): {self.total / GB:.1f} GB at the most"]
        out += [f"  {name:<22}{self.parts[name] / GB:>9.2f} GB  {self.notes.get(name, '')}" for name in self.parts]
        return out


def checkpoint_bytes(cfg: Config, policy: ModelShape, value: ModelShape | None) -> float:
    """One checkpoint's model state: the policy (its Hugging Face copy and learner.pt) and V (value/)."""
    size = policy.policy_params * (BYTES[cfg.model.dtype] + OPTIMIZER_BYTES)
    if value is not None:
        size += value.value_params * (4 + OPTIMIZER_BYTES)
    return float(size)


def record_bytes_per_step(cfg: Config) -> float:
    """metrics.jsonl and selections.jsonl: the records each checkpoint copies."""
    return METRICS_BYTES_PER_STEP + SELECTION_BYTES_PER_SAMPLE * cfg.run.m * cfg.run.n


def disk_plan(cfg: Config, policy: ModelShape, value: ModelShape | None) -> DiskPlan:
    """The disk `cfg`'s run writes at the most; `value` None when its strategy does not use V."""
    steps = cfg.run.steps
    plan = DiskPlan(steps)
    kept = cfg.checkpoint.keep + 1 + int(bool(cfg.evaluation.keep_best and cfg.evaluation.every))
    records = record_bytes_per_step(cfg) * steps
    one = checkpoint_bytes(cfg, policy, value)
    plan.parts["checkpoints"] = kept * (one + records)
    plan.notes["checkpoints"] = (f"{kept} x {one / GB:.1f} GB (checkpoint.keep {cfg.checkpoint.keep}, one being "
                                 f"written" + (", the best" if kept > cfg.checkpoint.keep + 1 else "")
                                 + f"), each with the step records to its step")
    trackers = TENSORBOARD_BYTES_PER_STEP if "tensorboard" in cfg.logging.backends else 0
    plan.parts["step records"] = (records + (trackers + DRIVER_OUTPUT_BYTES_PER_STEP) * steps)
    plan.notes["step records"] = (f"{record_bytes_per_step(cfg) + trackers + DRIVER_OUTPUT_BYTES_PER_STEP:,.0f} "
                                  f"bytes a step: metrics, selections (m x n = {cfg.run.m * cfg.run.n}), "
                                  + ("TensorBoard, " if trackers else "") + "the driver's output")
    if not cfg.redis.url:
        sample = PROMPT_TOKEN_BYTES * cfg.data.max_prompt_tokens + RESPONSE_TOKEN_BYTES * cfg.rollout.max_new_tokens
        data = sample * cfg.run.m * cfg.run.n + HISTORY_BYTES_PER_STEP * min(steps, HISTORY_CAP)
        plan.parts["Redis AOF"] = 2 * max(AOF_REWRITE_MIN_BYTES, data)
        plan.notes["Redis AOF"] = (f"twice the larger of auto-aof-rewrite-min-size ({AOF_REWRITE_MIN_BYTES >> 20} MB) "
                                   f"and Redis' data (at the most {data / GB:.2f} GB: a step's rollouts, the history)")
    return plan


def disk_shortfall(cfg: Config, plan: DiskPlan, policy: ModelShape, value: ModelShape | None) -> str | None:
    """Why the run does not fit `cluster.disk_gb`, with the checkpoint.keep that would (None when it fits, or when
    the config states no disk)."""
    limit = cfg.cluster.disk_gb
    if limit is None or plan.total <= limit * GB:
        return None
    fix = "raise cluster.disk_gb"
    for keep in range(cfg.checkpoint.keep - 1, 0, -1):
        fewer = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"keep": keep})})
        if disk_plan(fewer, policy, value).total <= limit * GB:
            fix = f"set checkpoint.keep <= {keep}, or {fix}"
            break
    return f"disk: the run writes up to {plan.total / GB:.1f} GB, cluster.disk_gb is {limit:g} GB; {fix}"
