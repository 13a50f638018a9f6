"""The run configuration's schema: one pydantic model per section, `Config` the whole tree (loading,
overrides and redaction are in `pcl.config`, which re-exports every name here). The training's sections are here;
the service's (Redis, control plane, checkpoints, evaluation, logging, curriculum figures, cluster) are in
`pcl.config_service`, Ray's in `pcl.config_ray`, the selection strategies' in `pcl.config_selection`.

Every section rejects unknown keys (`extra="forbid"`), every number carries its allowed range, and the
selection strategy is a discriminated union on `type`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pcl.config_base import ConfigError, Resources, Section  # noqa: F401 - re-exported
from pcl.config_ray import RayConfig
from pcl.config_selection import (  # noqa: F401 - re-exported: pcl.config and the strategies import them here
    DynamicSamplingSelection, GresoSelection, PCLSelection, PrefilterSelection, ProbeSelection, Selection,
    SpeedSelection, UniformSelection)
from pcl.config_service import (  # noqa: F401 - re-exported: pcl.config imports them here
    Backend, CheckpointConfig, ClusterConfig, ControlConfig, CurriculumConfig, EvaluationConfig, LoggingConfig,
    RedisConfig)


# The most steps a batch may be generated ahead of the one that trains on it: the batches ahead are held in the
# coordinator's memory and written into every checkpoint, and beyond a few versions the truncated importance
# weights leave little of the signal.
MAX_STALENESS = 4


class RunConfig(Section):
    name: str = Field("pcl", min_length=1, description="Run name; prefixes Redis keys and metrics.")
    seed: int = Field(0, ge=0, description="Seed for sampling, initialisation and generation.")
    steps: int = Field(100, ge=1, description="Number of training steps.")
    m: int = Field(512, ge=1, description="Prompts per step (the paper's m).")
    n: int = Field(16, description="Generations per prompt (the paper's n), at least 2: a prompt's advantages are "
                   "its rewards less their group's mean.")
    eval_every: int = Field(10, ge=0, description="Held-out evaluation every N steps (and at step 0); 0 disables.")
    eval_every_s: float | None = Field(None, gt=0, description="Held-out evaluation instead each time another N "
                                       "seconds of training have passed (evaluations excluded), and at step 0: "
                                       "the same spacing in time for strategies whose steps take different time.")
    eval_samples: int = Field(4, ge=1, description="Samples per held-out prompt; accuracy is their mean reward.")
    eval_temperature: float | None = Field(None, ge=0, le=5, description="Held-out sampling temperature; rollout.temperature when unset.")
    run_dir: str | None = Field(None, description="Where metrics and checkpoints go; --run-dir overrides.")
    time_budget_s: float | None = Field(None, gt=0, description="Stop after this many wall-clock seconds.")
    train_budget_s: float | None = Field(None, gt=0, description="Stop after this many seconds of training "
                                         "(train_elapsed_seconds: evaluations and checkpoint writes excluded), "
                                         "the paper's clock; the last evaluation is taken at the stop.")
    max_staleness: int = Field(0, ge=0, le=MAX_STALENESS, description="Asynchronous steps: s >= 1 lets the fleet "
                               "generate step t+s's batch while the learner trains step t, so each batch is "
                               "trained on exactly s policy versions after the one that generated it (fewer in "
                               "the first s steps). 0: synchronous steps. Needs a single-round selection "
                               "(uniform, pcl, prefilter) and learner.off_policy.correction; the s batches "
                               "generated ahead are held in memory and in every checkpoint.")

    @field_validator("n")
    @classmethod
    def _groups_can_differ(cls, n: int) -> int:
        if n < 2:  # GRPO's advantage is a reward less its group's mean: a group of one is its own mean
            raise ValueError("at least 2 generations per prompt are needed: with one, each group's mean reward is "
                             "its only sample's, so every advantage would be zero and the policy would never learn "
                             "(the paper: 16)")
        return n

    @property
    def evaluates_held_out(self) -> bool:
        """Whether held-out accuracy is measured at all (by steps or by seconds of training)."""
        return bool(self.eval_every or self.eval_every_s)


# The tiny task families (pcl.tiny.tasks), each a data source and a model.path of its built policy.
TINY_SOURCES = ("tiny", "tiny-carry")


class DataConfig(Section):
    source: str = Field("tiny", description="A tiny task ('tiny': sums answered alone; 'tiny-carry': sums answered "
                        "with a scratchpad, most prompts always or never solved), a known dataset (math, deepscaler, math500, aime24, aime25, amc23, "
                        "minerva, olympiadbench, or their Hugging Face names: pcl.data.datasets), a local .jsonl/.json/.parquet "
                        "path, or another Hugging Face dataset name.")
    root: str | None = Field(None, description="Directory of local copies of the known datasets (math500.jsonl, ...), "
                             "read instead of the hub; PCL_DATA_ROOT when unset.")
    split: str = Field("train", description="Split, for Hugging Face datasets.")
    revision: str | None = Field(None, min_length=1, description="Hugging Face revision (commit sha, tag or branch) "
                                 "of `source`, when read from the hub; a resume with another one is refused. Unset: "
                                 "the known dataset's pinned revision if it has one, else the hub's newest.")
    prompt_field: str = Field("problem", description="Field holding the question.")
    answer_field: str = Field("answer", description="Field holding the gold answer (str, number or list).")
    id_field: str | None = Field(None, description="Field holding a stable row id; the row index when unset.")
    template: Literal["qwen_base", "chat", "plain", "tiny"] = Field(
        "qwen_base", description="Prompt template: the paper's Qwen base suffix, the tokenizer's chat template, as is, or the tiny task's."
    )
    max_prompt_tokens: int = Field(1024, ge=1, description="Longer prompts are skipped and counted, never cut.")
    eval_source: str | None = Field(None, description="Held-out set (same forms as `source`); a tiny task's name uses its held-out split.")
    eval_size: int = Field(256, ge=1, description="Held-out prompts evaluated at each evaluation.")
    tiny_size: int = Field(4096, ge=16, description="Training prompts generated for the tiny task.")


class ModelConfig(Section):
    path: str = Field("tiny", description="Policy: a local Hugging Face directory, a hub name, or a tiny task's name "
                      "('tiny', 'tiny-carry': its built policy).")
    tokenizer: str | None = Field(None, description="Tokenizer path; the model's when unset.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where the policy lives.")


class OptimizerConfig(Section):
    lr: float = Field(8e-6, gt=0, le=1, description="Policy learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay.")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.999, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float | None = Field(1.0, gt=0, description="Global gradient-norm clip; null disables.")


class ValueModelConfig(Section):
    path: str | None = Field(None, description="Backbone; the policy's path when unset (same size as the policy).")
    lr: float = Field(1e-6, gt=0, le=1, description="Value-model learning rate (the paper: 1e-6).")
    batch_size: int = Field(64, ge=1, description="Prompts per forward pass when scoring candidates.")
    grad_clip: float | None = Field(1.0, gt=0)
    num_ranks: int = Field(1, ge=1, description="Processes V is sharded over with FSDP2 (each takes "
                           "learner.num_gpus_per_rank GPUs; NCCL on GPU, gloo on CPU); 1: one unsharded V. V "
                           "trains in float32 with AdamW, ~16 bytes per parameter: `pcl plan` says how many fit.")
    score_dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="dtype of the copy of V "
                                                               "that scores candidates, refreshed after each V "
                                                               "step; auto: bfloat16 on GPU, float32 on CPU.")
    ev_sample: int = Field(32, ge=0, description="Unfiltered candidates rolled out on a probe step to measure V's "
                           "explained variance (monitoring: never trained on).")
    ev_every: int = Field(4, ge=1, description="Steps between V's explained-variance probes (steps 1, 1+N, ...); "
                          "the figure covers the last 4 probes. 1: every step (on tiny-carry the probe is then about "
                          "15% of a PCL step's time).")
    max_tokens_per_micro_batch: int | None = Field(None, ge=2, description="Prompt tokens of one scoring or training "
                                                   "pass, padding included (prompts x the longest), besides batch_size; "
                                                   "at least data.max_prompt_tokens. null: batch_size prompts a pass.")
    activation_checkpointing: bool = Field(False, description="Recompute each layer of V's backbone in its backward "
                                           "pass (training only; scoring keeps no activations).")
    train_beside_policy: bool = Field(True, description="V's step on a batch runs beside the policy's (both train "
                                      "on the same batch; V's actor may share the learner's cores). false: after "
                                      "it, so that the policy's step time (policy_train_seconds) is its own; the "
                                      "algorithm is the same, the step longer by V's step.")
    resources: Resources = Field(default_factory=dict, description="Custom Ray resources {name: amount} each value scorer needs, to steer placement on a cluster (nodes offer them with `ray start --resources`).")




class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = Field("hf", description="Generation engine.")
    num_workers: int = Field(1, ge=1, description="Rollout workers (actors).")
    temperature: float = Field(1.0, ge=0, le=5)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, description="-1 disables top-k.")
    max_new_tokens: int = Field(4096, ge=1, description="Longer responses are truncated and rewarded 0.")
    max_in_flight: int = Field(8, ge=1, description="Requests a worker holds at once (backpressure).")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads of each CPU rollout worker: during "
                         "generation the learner ranks are idle, so a worker may use their cores.")
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1, description="vLLM only.")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM only.")
    num_gpus_per_worker: float = Field(0.0, ge=0)
    resources: Resources = Field(default_factory=dict, description="Custom Ray resources {name: amount} each rollout worker needs, to steer placement on a cluster (nodes offer them with `ray start --resources`).")
    step_timeout_s: float = Field(1800.0, gt=0, description="Deadline for a step's samples to be generated and verified.")
    straggler_timeout_s: float | None = Field(None, gt=0, description="A worker that has made no progress for this "
                                              "long (its pass or its heartbeat stalled) has its chunk handed to the "
                                              "live workers; the first copy in counts. null: derived, "
                                              "max(10 s, 3 x the chunk's samples x the fleet's measured seconds "
                                              "per sample).")
    stuck_timeout_s: float | None = Field(300.0, gt=0, description="A worker without progress this long is "
                                          "restarted (its process killed; Ray starts it again). null: never.")
    deterministic: bool = Field(False, description="Seed each request from (run.seed, step, prompt, first sample "
                                "index) and generate it alone: samples no longer depend on batching or on which "
                                "worker serves them, so a resumed run repeats a straight one exactly (CPU; slower).")
    weight_sync: Literal["rpc", "collective"] = Field("rpc", description="vLLM only: how each step's weights "
                                                      "reach the workers. rpc: safetensors chunks over vLLM's "
                                                      "collective_rpc (after Ray's object store); collective: a "
                                                      "bucketed torch.distributed broadcast from learner rank 0 "
                                                      "into every vLLM worker (NCCL on GPU, gloo on CPU).")
    weight_sync_bucket_mb: int = Field(256, ge=1, le=16384, description="collective: MiB per broadcast bucket.")

    @model_validator(mode="after")
    def _collective_needs_vllm(self) -> "RolloutConfig":
        if self.weight_sync == "collective" and self.engine != "vllm":
            raise ValueError("weight_sync=collective needs engine=vllm (the HF engine takes weights by rpc)")
        return _stuck_after_straggler(self)


def _stuck_after_straggler(section):
    """A worker is restarted only after its work was handed over: stuck_timeout_s above straggler_timeout_s."""
    stuck, straggler = section.stuck_timeout_s, section.straggler_timeout_s
    if stuck is not None and straggler is not None and stuck <= straggler:
        raise ValueError(f"stuck_timeout_s ({stuck:g}) must exceed straggler_timeout_s ({straggler:g}): a worker "
                         f"is restarted only after its work was handed to the others")
    return section


class VerifierConfig(Section):
    num_workers: int = Field(1, ge=1, description="Verifier workers (actors).")
    processes: int = Field(2, ge=1, description="Spawned math-verify processes per worker.")
    timeout_s: float = Field(5.0, gt=0, le=600, description="Hard per-sample timeout; a timeout is reward 0.")
    max_tasks_per_worker: int | None = Field(10000, ge=1, description="Samples a math-verify process scores before "
                                             "it is recycled (replaced by a fresh one, whose start costs about as "
                                             "much CPU as a thousand samples); null: never.")
    max_error_share: float = Field(0.1, ge=0, le=1, description="A step whose share of rewards that are verifier "
                                   "errors (not verdicts) exceeds this fails instead of training on their zeros.")
    resources: Resources = Field(default_factory=dict, description="Custom Ray resources {name: amount} each verifier worker needs, to steer placement on a cluster (nodes offer them with `ray start --resources`).")
    straggler_timeout_s: float | None = Field(None, gt=0, description="A verifier without progress this long has "
                                              "the results it holds handed to the live verifiers. null: derived "
                                              "from the measured verification seconds per sample, at least 10 s.")
    stuck_timeout_s: float | None = Field(120.0, gt=0, description="A verifier without progress this long is "
                                          "restarted (its process killed; Ray starts it again). null: never.")

    @model_validator(mode="after")
    def _stuck_after_straggler(self) -> "VerifierConfig":
        return _stuck_after_straggler(self)


# The rollout engines that report each sampled token's log-probability (`Generation.logprobs`): the off-policy
# correction reads them.
LOGPROB_ENGINES = ("hf", "vllm")


class OffPolicyConfig(Section):
    """The policy-gradient loss's correction for samples generated by another policy than the learner's: an older
    version (an asynchronous fleet) or the same weights computed otherwise (an engine's kernels, its dtype)."""

    correction: Literal["none", "truncated"] = Field("none", description="none: the on-policy loss, as the "
                                                     "synchronous service trains. truncated: truncated importance "
                                                     "sampling (Yao et al., 2025; verl's tis_imp_ratio_cap): each "
                                                     "response token's term weighted by min(pi_learner / pi_engine, "
                                                     "cap) from the engine's sampled-token log-probabilities, which "
                                                     "every sample then must carry.")
    cap: float = Field(2.0, ge=1, allow_inf_nan=False, description="truncated: the largest weight C a token gets "
                       "(>= 1, so on-policy tokens keep weight 1); the step records the share of tokens above it.")


class LearnerConfig(Section):
    num_ranks: int = Field(1, ge=1, description="Learner ranks (one torch.distributed process group, FSDP2).")
    micro_batch_size: int = Field(8, ge=1, description="Sequences per forward/backward; gradients accumulate.")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: NCCL with GPUs, gloo without.")
    num_gpus_per_rank: float = Field(0.0, ge=0)
    timeout_s: float = Field(1800.0, gt=0, description="Deadline for one learner call (a step, a weight gather, a "
                             "checkpoint) and for every other remote call the coordinator makes.")
    collective_timeout_s: float = Field(1800.0, gt=0, description="The learner ranks' process group: a collective "
                                        "(all-gather, reduce-scatter) a peer does not join within this fails on "
                                        "every rank that waits (torch.distributed's timeout).")
    ping_timeout_s: float = Field(10.0, gt=0, description="After a learner or V call failed, a rank that does not "
                                  "answer a ping within this is declared lost: the group restarts.")
    resources: Resources = Field(default_factory=dict, description="Custom Ray resources {name: amount} each learner rank needs, to steer placement on a cluster (nodes offer them with `ray start --resources`).")
    reshard_after_forward: bool = Field(True, description="FSDP2: free gathered parameters after forward (memory) "
                                        "or keep them for backward (speed, for small models).")
    max_tokens_per_micro_batch: int | None = Field(None, ge=2, description="Tokens of one forward/backward, "
                                                   "padding included (sequences x the longest); sequences are packed "
                                                   "longest first up to it (micro_batch_size still caps the count); "
                                                   "at least data.max_prompt_tokens + rollout.max_new_tokens. null: "
                                                   "micro_batch_size sequences whatever their length.")
    activation_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in the "
                                           "backward pass (one layer input kept per layer; ~1/3 more compute).")
    compile: bool = Field(False, description="torch.compile each decoder layer's computation (fuses the norms, rotary "
                          "embedding and gated activation; the first steps pay the compilation). For GPU runs.")
    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig, description="The loss's correction for "
                                        "samples of another policy (off by default: the on-policy loss).")
    max_skipped_steps: int = Field(3, ge=1, description="The run stops, naming the cause, after this many policy "
                                   "steps in a row skipped for a non-finite loss or gradient norm (each is "
                                   "counted in policy_skipped_steps_total).")


class Config(Section):
    run: RunConfig = RunConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    value: ValueModelConfig = ValueModelConfig()
    selection: Selection = PCLSelection()
    rollout: RolloutConfig = RolloutConfig()
    verifier: VerifierConfig = VerifierConfig()
    learner: LearnerConfig = LearnerConfig()
    redis: RedisConfig = RedisConfig()
    control: ControlConfig = ControlConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    logging: LoggingConfig = LoggingConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    cluster: ClusterConfig = ClusterConfig()
    ray: RayConfig = RayConfig()

    @model_validator(mode="after")
    def _token_budgets_hold_the_longest_sequence(self) -> "Config":
        longest = self.data.max_prompt_tokens + self.rollout.max_new_tokens
        budget = self.learner.max_tokens_per_micro_batch
        if budget is not None and budget < longest:
            raise ValueError(f"learner.max_tokens_per_micro_batch ({budget}) is below the longest sequence, {longest} "
                             f"tokens (data.max_prompt_tokens {self.data.max_prompt_tokens} + rollout.max_new_tokens "
                             f"{self.rollout.max_new_tokens}): raise it to at least {longest}")
        budget = self.value.max_tokens_per_micro_batch
        if budget is not None and budget < self.data.max_prompt_tokens:
            raise ValueError(f"value.max_tokens_per_micro_batch ({budget}) is below the longest prompt, "
                             f"{self.data.max_prompt_tokens} tokens (data.max_prompt_tokens): raise it to at least "
                             f"{self.data.max_prompt_tokens}")
        return self

    @model_validator(mode="after")
    def _asynchronous_steps_can_be_generated_ahead(self) -> "Config":
        staleness = self.run.max_staleness
        if not staleness:
            return self
        if not getattr(self.selection, "single_round", False):
            raise ValueError(f"run.max_staleness = {staleness} generates each step's batch ahead in one round; "
                             f"selection.type = {self.selection.type!r} generates several rounds within a step, each "
                             "on the step's own policy: use run.max_staleness = 0 with it (asynchronous steps take "
                             "uniform, pcl or prefilter)")
        if self.learner.off_policy.correction == "none":
            raise ValueError(f"run.max_staleness = {staleness} trains on samples of a policy {staleness} versions "
                             "older than the learner's: set learner.off_policy.correction = 'truncated' (the loss "
                             "weighted by the truncated importance ratio), or run.max_staleness = 0")
        return self

    @model_validator(mode="after")
    def _off_policy_correction_has_engine_logprobs(self) -> "Config":
        correction = self.learner.off_policy.correction
        if correction != "none" and self.rollout.engine not in LOGPROB_ENGINES:
            raise ValueError(f"learner.off_policy.correction = {correction!r} needs the engine's sampled-token "
                             f"log-probabilities, which rollout.engine = {self.rollout.engine!r} does not report "
                             f"(engines that do: {', '.join(LOGPROB_ENGINES)})")
        return self
