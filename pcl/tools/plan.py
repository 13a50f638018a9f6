"""GPU memory of a run, per GPU, against a cluster shape: what `pcl plan CONFIG` prints and checks.

    plan = plan_run(cfg)                     # cfg.cluster, or a ClusterConfig of its own
    print(plan.table())
    plan.shortfalls                          # [] when it fits, else one sentence per problem

Counted, per GPU of each role:
- policy learner (FSDP2 over learner.num_ranks): float32 master weights, float32 gradients and AdamW's two
  float32 moments, 16 bytes per parameter over the ranks, plus the weights gathered for compute (model.dtype:
  the root's embeddings / head and two decoder layers, or every layer with reshard_after_forward off);
- value model (value.num_ranks): the same 16 bytes per parameter of V's backbone and head, plus the scoring
  copy (value.score_dtype, whole on every rank; none for one float32 rank) and, sharded, float32 gathered layers;
- rollout worker GPU (vLLM): its gpu_memory_utilization share, holding the model.dtype weights over
  tensor_parallel_size GPUs and the KV cache in the rest, which must hold one max-length sequence
  (pcl.engines.max_model_len: data.max_prompt_tokens + the larger of rollout.max_new_tokens and
  evaluation.max_new_tokens, the context vLLM is started with) and is reported in such sequences.
The learner and V also hold the activations of one micro-batch: `max_tokens_per_micro_batch` tokens (else
micro_batch_size / batch_size sequences of the longest length), every layer's saved tensors without activation
checkpointing, with it one input per layer plus one layer recomputed (`ModelShape.activation_bytes`); the policy's
LM head adds one chunk of logits (LOGITS_CHUNK positions x vocabulary, with its softmax and gradient) and, below
float32, a float32 accumulator of the head's gradient. Estimates of what autograd keeps for a Llama / Qwen layer
with fused attention (no T x T scores). Not counted: the CUDA context and allocator fragmentation;
`cluster.headroom` of every learner and value GPU is kept for them. GB here are 10^9 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only types here: the shapes and FLOPs import without pydantic (bench/gpu_check.py)
    from pcl.config import ClusterConfig, Config
from pcl.engines import max_model_len
from pcl.strategies import make_strategy
from pcl.tools.disk import DiskPlan, disk_plan, disk_shortfall
from pcl.tools.shapes import KNOWN_MODELS, LOGITS_CHUNK, ModelShape, PlanError, model_shape  # noqa: F401 (re-exported)

GB = 1e9
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TRAIN_BYTES = 16  # float32 weights + gradients + AdamW exp_avg + exp_avg_sq


@dataclass
class Role:
    """One kind of GPU in the run: `count` of them, each holding `parts` (name -> bytes) within `budget`."""

    name: str
    count: int
    gpus_each: float
    parts: dict[str, float]
    budget: float
    note: str = ""
    tokens: int | None = None  # tokens of one micro-batch (learner, V)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@dataclass
class Plan:
    cluster: ClusterConfig
    roles: list[Role] = field(default_factory=list)
    shortfalls: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    disk: DiskPlan | None = None

    def table(self) -> str:
        columns = ["weights", "grads", "optimizer", "gathered", "activations", "logits", "scoring copy", "KV cache"]
        c = self.cluster
        lines = [f"cluster: {c.nodes} x {c.gpus_per_node} GPUs of {c.gpu_memory_gb:g} GB "
                 f"({c.headroom:.0%} of each learner / value GPU kept free)",
                 f"{'GB per GPU':<15}{'GPUs':>6}" + "".join(f"{name:>13}" for name in columns)
                 + f"{'total':>9}{'budget':>9}{'mb tokens':>11}"]
        for role in self.roles:
            cells = "".join(f"{role.parts[n] / GB:>13.1f}" if n in role.parts else f"{'-':>13}" for n in columns)
            lines.append(f"{role.name:<15}{role.count * role.gpus_each:>6g}{cells}"
                         f"{role.total / GB:>9.1f}{role.budget / GB:>9.1f}"
                         f"{'-' if role.tokens is None else role.tokens:>11}")
        lines += [f"  {note}" for note in self.notes]
        if self.disk is not None:
            limit = c.disk_gb
            lines += self.disk.lines() + [f"  cluster.disk_gb: {limit:g} GB" if limit is not None else
                                          "  cluster.disk_gb unset: not checked"]
        problems = "\n".join(f"  {s}" for s in self.shortfalls)
        lines.append(f"does not fit:\n{problems}" if self.shortfalls else "fits")
        return "\n".join(lines)


def _trained(params: int, ranks: int) -> dict[str, float]:
    share = params / ranks
    return {"weights": 4 * share, "grads": 4 * share, "optimizer": 8 * share}


def learner_tokens(cfg: Config) -> int:
    """Tokens of the learner's largest micro-batch: its token budget, or micro_batch_size longest sequences."""
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    capped = cfg.learner.micro_batch_size * longest
    budget = cfg.learner.max_tokens_per_micro_batch
    return capped if budget is None else min(budget, capped)


def value_tokens(cfg: Config) -> int:
    """Prompt tokens of V's largest training pass: its token budget, or batch_size longest prompts."""
    capped = cfg.value.batch_size * cfg.data.max_prompt_tokens
    budget = cfg.value.max_tokens_per_micro_batch
    return capped if budget is None else min(budget, capped)


def _learner(cfg: Config, shape: ModelShape, gpu: float) -> Role:
    ranks, compute = cfg.learner.num_ranks, BYTES[cfg.model.dtype]
    parts = _trained(shape.policy_params, ranks)
    if ranks > 1 or compute != 4:  # FSDP2 gathers (and casts) the weights it computes with
        layers = shape.layers if not cfg.learner.reshard_after_forward else min(2, shape.layers)
        root = shape.policy_params - shape.layers * shape.layer_params
        parts["gathered"] = compute * (root + layers * shape.layer_params)
    learner = cfg.learner
    parts["activations"] = shape.activation_bytes(learner_tokens(cfg), compute, learner.activation_checkpointing)
    parts["logits"] = shape.logits_bytes(compute)
    return Role("policy learner", ranks, cfg.learner.num_gpus_per_rank, parts, gpu * (1 - cfg.cluster.headroom),
                tokens=learner_tokens(cfg))


def _value(cfg: Config, shape: ModelShape, gpu: float) -> Role:
    ranks = cfg.value.num_ranks
    parts = _trained(shape.value_params, ranks)
    score = cfg.value.score_dtype if cfg.value.score_dtype != "auto" else "bfloat16"  # auto on GPU
    if ranks > 1 or score != "float32":
        parts["scoring copy"] = BYTES[score] * shape.value_params
    if ranks > 1:
        root = shape.value_params - shape.layers * shape.layer_params
        parts["gathered"] = 4 * (root + min(2, shape.layers) * shape.layer_params)
    parts["activations"] = shape.activation_bytes(value_tokens(cfg), 4, cfg.value.activation_checkpointing)
    return Role("value model", ranks, cfg.learner.num_gpus_per_rank, parts, gpu * (1 - cfg.cluster.headroom),
                tokens=value_tokens(cfg))


def _rollout(cfg: Config, shape: ModelShape, gpu: float) -> tuple[Role, int]:
    """The rollout role and how many max-length sequences one worker's KV cache holds."""
    r, dtype = cfg.rollout, BYTES[cfg.model.dtype]
    tp = r.tensor_parallel_size
    budget = r.gpu_memory_utilization * gpu
    weights = dtype * shape.policy_params / tp
    kv = max(0.0, budget - weights)
    max_len = max_model_len(cfg)  # the context the rollout worker starts vLLM with
    sequences = int(kv * tp // (shape.kv_bytes_per_token(dtype) * max_len))
    role = Role("rollout (vLLM)", r.num_workers, r.num_gpus_per_worker, {"weights": weights, "KV cache": kv}, budget)
    return role, sequences


def _with(cfg: Config, section: str, **update) -> Config:
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=update)})


def _fits(role_of, cfg: Config, shape: ModelShape, gpu: float) -> bool:
    role = role_of(cfg, shape, gpu)
    return role.total <= role.budget


def _fix(role_of, cfg: Config, shape: ModelShape, gpu: float, section: str) -> str:
    """The first single setting of `section` that makes the role fit, as '; set ...' (or what is left to try):
    activation checkpointing, then a smaller token budget (down to the longest sequence), then more ranks."""
    settings = getattr(cfg, section)
    if not settings.activation_checkpointing and _fits(role_of, _with(cfg, section, activation_checkpointing=True),
                                                      shape, gpu):
        return f"; set {section}.activation_checkpointing: true"
    longest = cfg.data.max_prompt_tokens + (cfg.rollout.max_new_tokens if section == "learner" else 0)
    tokens = learner_tokens(cfg) if section == "learner" else value_tokens(cfg)
    while tokens // 2 >= longest:
        tokens //= 2
        if _fits(role_of, _with(cfg, section, max_tokens_per_micro_batch=tokens), shape, gpu):
            return f"; set {section}.max_tokens_per_micro_batch <= {tokens}"
    for ranks in range(settings.num_ranks + 1, 257):
        if _fits(role_of, _with(cfg, section, num_ranks=ranks), shape, gpu):
            return f"; set {section}.num_ranks >= {ranks}"
    for ranks in range(settings.num_ranks + 1, 257):  # both: more ranks, and the smallest budget
        trial = _with(cfg, section, num_ranks=ranks, max_tokens_per_micro_batch=longest, activation_checkpointing=True)
        if _fits(role_of, trial, shape, gpu):
            return (f"; set {section}.num_ranks >= {ranks} with {section}.max_tokens_per_micro_batch {longest} and "
                    f"{section}.activation_checkpointing: true")
    if section == "value":
        return "; no value.num_ranks fits (the scoring copy is whole on every rank)"
    return ""


def plan_run(cfg: Config, cluster: ClusterConfig | None = None) -> Plan:
    """Memory per GPU of every role of `cfg` on `cluster` (cfg.cluster when None), with the shortfalls."""
    cluster = cluster or cfg.cluster
    cfg = cfg.model_copy(update={"cluster": cluster})
    plan, gpu = Plan(cluster), cluster.gpu_memory_gb * GB
    needs_value = make_strategy(cfg.selection, cfg.run.m, cfg.run.seed, n=cfg.run.n).needs_values
    on_gpus = cfg.learner.num_gpus_per_rank > 0 and cfg.rollout.num_gpus_per_worker > 0
    try:
        policy = model_shape(cfg.model.path)
        value = model_shape(cfg.value.path or cfg.model.path)
    except PlanError:
        if on_gpus:
            raise
        plan.notes.append("learner.num_gpus_per_rank or rollout.num_gpus_per_worker is 0: a CPU run, not checked")
        return plan
    plan.disk = disk_plan(cfg, policy, value if needs_value else None)
    if problem := disk_shortfall(cfg, plan.disk, policy, value if needs_value else None):
        plan.shortfalls.append(problem)
    if not on_gpus:
        plan.notes.append("learner.num_gpus_per_rank or rollout.num_gpus_per_worker is 0: a CPU run, GPU memory not "
                          "checked")
        return plan
    plan.notes.append(f"policy {cfg.model.path}: {policy.policy_params / 1e9:.2f}B parameters ({policy.source}); "
                      f"V: {value.value_params / 1e9:.2f}B")
    on_off = {True: "on", False: "off"}
    plan.notes.append(f"micro-batches (mb tokens): learner.max_tokens_per_micro_batch "
                      f"{cfg.learner.max_tokens_per_micro_batch}, micro_batch_size {cfg.learner.micro_batch_size}, "
                      f"activation checkpointing {on_off[cfg.learner.activation_checkpointing]}; V "
                      f"value.max_tokens_per_micro_batch {cfg.value.max_tokens_per_micro_batch}, batch_size "
                      f"{cfg.value.batch_size}, activation checkpointing {on_off[cfg.value.activation_checkpointing]}")
    learner = _learner(cfg, policy, gpu)
    plan.roles.append(learner)
    if learner.total > learner.budget:
        plan.shortfalls.append(_short("policy learner", learner, cluster) + _fix(_learner, cfg, policy, gpu, "learner"))
    if needs_value:
        role = _value(cfg, value, gpu)
        plan.roles.append(role)
        if role.total > role.budget:
            plan.shortfalls.append(_short("V", role, cluster) + _fix(_value, cfg, value, gpu, "value"))
    rollout, sequences = _rollout(cfg, policy, gpu)
    plan.roles.append(rollout)
    plan.notes.append(f"each rollout worker's KV cache holds {sequences} sequences of "
                      f"{max_model_len(cfg)} tokens")
    if sequences < 1:
        plan.shortfalls.append(f"rollout on {cfg.rollout.tensor_parallel_size} x {cluster.gpu_memory_gb:g} GB: "
                               f"the {rollout.parts['weights'] / GB:.1f} GB of weights per GPU leave no KV cache "
                               f"for one sequence in {rollout.budget / GB:.1f} GB (rollout.gpu_memory_utilization); "
                               "raise it or rollout.tensor_parallel_size")
    if cfg.rollout.tensor_parallel_size > cluster.gpus_per_node:
        plan.shortfalls.append(f"rollout.tensor_parallel_size {cfg.rollout.tensor_parallel_size} exceeds the "
                               f"{cluster.gpus_per_node} GPUs of a node")
    wanted = math.ceil(sum(role.count * role.gpus_each for role in plan.roles) - 1e-9)
    have = cluster.nodes * cluster.gpus_per_node
    plan.notes.append(f"GPUs: {wanted} asked of {have}")
    if wanted > have:
        plan.shortfalls.append(f"the run asks for {wanted} GPUs, the cluster has {have} "
                               f"({cluster.nodes} x {cluster.gpus_per_node}), short by {wanted - have}")
    return plan


def _short(what: str, role: Role, cluster: ClusterConfig) -> str:
    return (f"{what} on {role.count} x {cluster.gpu_memory_gb:g} GB: needs {role.total / GB:.1f} GB per GPU, "
            f"{role.budget / GB:.1f} GB usable, short by {(role.total - role.budget) / GB:.1f} GB")


def plan_refusal(cfg: Config) -> str | None:
    """Why `pcl train` refuses `cfg` on GPUs: the plan's shortfalls as one message (None when it fits, when it is
    a CPU run, or when the model's shape is unknown, as with a hub id the plan has no table for)."""
    try:
        plan = plan_run(cfg)
    except PlanError:
        return None
    if not plan.shortfalls:
        return None
    return ("pcl plan says this config does not fit its cluster (cluster.*):\n"
            + "\n".join(f"  {s}" for s in plan.shortfalls)
            + "\nchange the setting named, or pass --ignore-plan to train anyway")

