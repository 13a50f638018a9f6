"""The run configuration's schema: one pydantic model per section, `Config` the whole tree (loading,
overrides and redaction are in `pcl.config`, which re-exports every name here).

Every section rejects unknown keys (`extra="forbid"`), every number carries its allowed range, and the
selection strategy is a discriminated union on `type`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pcl.config_base import ConfigError, Resources, Section  # noqa: F401 - re-exported
from pcl.config_ray import RayConfig
from pcl.config_selection import (  # noqa: F401 - re-exported: pcl.config and the strategies import them here
    DynamicSamplingSelection, GresoSelection, PCLSelection, PrefilterSelection, ProbeSelection, Selection,
    SpeedSelection, UniformSelection)
from pcl.config_urls import check_mlflow_uri, check_redis_url
from pcl.credentials import check_token


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


class RedisConfig(Section):
    url: str | None = Field(None, description="redis://, rediss:// or unix:// URL; REDIS_URL when unset; embedded "
                            "server when neither.")
    visibility_timeout_s: float = Field(30.0, gt=0, description="Entries pending this long on a dead consumer are reclaimed.")
    max_deliveries: int = Field(3, ge=1, description="A record that fails this often goes to the dead-letter stream.")
    block_ms: int = Field(200, ge=1, description="Blocking read timeout.")
    appendonly: bool = Field(True, description="AOF persistence for the embedded server.")
    maxmemory_mb: int | None = Field(None, ge=0, description="maxmemory of the embedded server (noeviction: a full "
                                     "server makes writers wait); a quarter of the machine's memory when unset; 0: none.")
    reconnect_timeout_s: float = Field(60.0, gt=0, description="How long a work queue keeps retrying while Redis is "
                                       "unreachable (restarting, replaying its AOF, cut off) before it fails "
                                       "(QueueUnavailable: the driver restarts the run from its checkpoint).")
    full_timeout_s: float = Field(600.0, gt=0, description="How long a write waits while Redis is full (maxmemory "
                                  "reached) before it fails (RedisFull).")

    @field_validator("url")
    @classmethod
    def _redis_scheme(cls, url: str | None) -> str | None:
        return None if url is None else check_redis_url(url)


class ControlConfig(Section):
    enabled: bool = Field(True, description="Serve the control plane with the run.")
    host: str = Field("127.0.0.1")
    port: int = Field(8600, ge=0, le=65535, description="0 picks a free port.")
    token: str | None = Field(None, description="Bearer token (at least 32 characters, no placeholder); "
                              "PCL_API_TOKEN when unset; generated when neither. Never printed.")
    allowed_hosts: list[str] = Field(default_factory=list, description="Host headers served (a guard against DNS "
                                     "rebinding), e.g. [pcl.example.org, 127.0.0.1]; '*.example.org' for subdomains; "
                                     "empty: any.")
    docs: bool = Field(False, description="Serve the Swagger UI at /docs (it loads scripts from cdn.jsdelivr.net); "
                       "/openapi.json is always served.")
    max_body_bytes: int = Field(65536, ge=1024, description="Larger request bodies are refused (413) unread.")
    max_concurrent_requests: int = Field(64, ge=1, description="Requests served at once; more get 503 at once.")
    depth_cache_s: float = Field(5.0, ge=0, description="Queue depths in /v1/status and /metrics are at most this "
                                 "old (computed once per interval, however many clients ask); 0: every request.")
    heartbeat_ttl_s: float = Field(30.0, ge=3, description="The coordinator's heartbeat lives this long in Redis: "
                                   "without a beat for this long the status says 'lost' (pcl_coordinator_up 0). "
                                   "It beats every third of it at most.")

    @field_validator("token")
    @classmethod
    def _strong_token(cls, token: str | None) -> str | None:
        return None if token is None else check_token(token, "control.token")


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Checkpoint every N steps; 0 only on request and at the end.")
    keep: int = Field(2, ge=1, description="Complete checkpoints kept.")
    max_restarts: int = Field(3, ge=0, description="Times the driver restarts the run from its newest checkpoint "
                              "(from the start when there is none) after a failure no actor restart covers: a "
                              "learner rank, the sampler or the coordinator lost, a deadline missed.")
    restart_wait_s: float = Field(20.0, gt=0, description="At such a restart, an actor that does not answer (or, a "
                                  "worker, stop serving) within this is declared lost and started again; those that "
                                  "answer are kept.")


class EvaluationConfig(Section):
    """The paper's benchmarks evaluated through the rollout fleet during training, and by `pcl eval` (which takes
    every setting from here: `pcl.benchmarks.eval_plan`)."""

    suite: list[Literal["math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench"]] = Field(
        default_factory=list, description="Benchmarks evaluated every `every` steps; empty: none (pcl eval: all six).")
    every: int = Field(0, ge=0, description="Evaluate the suite every N steps and at the end; 0: never.")
    k: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict, description="avg@k per benchmark; the "
                                                      "paper's for those not named (AIME, AMC 32; Minerva 4; others 1).")
    limit: int | None = Field(None, ge=1, description="The first N prompts of each benchmark only.")
    temperature: float = Field(0.6, ge=0, le=5)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(20, ge=-1, description="-1 disables top-k.")
    max_new_tokens: int | None = Field(None, ge=1, description="rollout.max_new_tokens when unset.")
    keep_best: bool = Field(True, description="Checkpoint at each new best score (best_by) and keep it (best.json "
                            "names it) beside the last checkpoint.keep.")
    best_by: Literal["average", "math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench"] = Field(
        "average", description="The score that picks the best checkpoint: 'average' (the suite's mean) or one "
        "benchmark of the suite (the paper: math500 for MATH runs, the six-benchmark average for DeepScaleR).")

    @model_validator(mode="after")
    def _best_by_in_suite(self) -> "EvaluationConfig":
        if self.suite and self.best_by != "average" and self.best_by not in self.suite:
            raise ValueError(f"best_by ({self.best_by!r}) must be 'average' or a benchmark of the suite {self.suite}")
        return self


Backend = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow", "trackio"]


class LoggingConfig(Section):
    """Where each step's metrics go besides RUN_DIR/metrics.jsonl (always written): experiment trackers, for
    comparing runs. Each tracker library is imported only when named here (`services.tracking.trackers`)."""

    backends: list[Backend] = Field(default_factory=lambda: ["console", "jsonl"], description="console (a line "
                                    "per step), jsonl (always on), tensorboard, wandb, mlflow, trackio.")
    project: str = Field("pcl", min_length=1, description="Project / experiment name in wandb, MLflow and trackio.")
    mlflow_tracking_uri: str | None = Field(None, description="MLflow tracking URI (a local directory, file:, "
                                            "http(s)://, sqlite:///, a database URL, databricks...); "
                                            "MLFLOW_TRACKING_URI when unset, else a local store in RUN_DIR.")

    @field_validator("mlflow_tracking_uri")
    @classmethod
    def _mlflow_scheme(cls, uri: str | None) -> str | None:
        return None if uri is None else check_mlflow_uri(uri)

    @field_validator("backends")
    @classmethod
    def _jsonl_always(cls, backends: list[str]) -> list[str]:
        unique = list(dict.fromkeys(backends))
        return unique if "jsonl" in unique else ["jsonl", *unique]


class CurriculumConfig(Section):
    """What the step record says about the curriculum (`pcl.loop.curriculum_window`): V's calibration on its random
    probe and on the trained prompts, the pool V scored, and the gain of the selection over uniform selection
    (realised effective ratio minus the probe's), pooled over the last `window` steps; and when that gain stays
    low, a warning naming what to change. Figures of runs whose strategy uses V (pcl)."""

    window: int = Field(16, ge=1, description="Steps the calibration and gain figures pool (V's probe runs every "
                        "value.ev_every steps: 16 steps hold 4 probes at the default).")
    bins: int = Field(10, ge=2, le=100, description="Equal-width bins of V in [0, 1] for the reliability tables "
                      "and the pool's histogram.")
    min_gain: float | None = Field(0.05, ge=-1, le=1, description="The gain (effective ratio over uniform "
                                   "selection's) below which the curriculum is not paying; null: never warn.")
    patience: int = Field(20, ge=1, description="Steps in a row with the gain below min_gain before the warning: "
                          "a log line, a control-plane event and curriculum_stalled.")


class ClusterConfig(Section):
    """The cluster `pcl plan` checks a run's GPU memory and disk against (nothing else reads it)."""

    nodes: int = Field(1, ge=1, description="Nodes.")
    gpus_per_node: int = Field(8, ge=1, description="GPUs per node.")
    gpu_memory_gb: float = Field(80.0, gt=0, description="Memory of one GPU, in GB (10^9 bytes).")
    headroom: float = Field(0.1, ge=0, lt=1, description="Share of every learner and value GPU kept free for what "
                            "the plan does not count: activations, the CUDA context, allocator fragmentation.")
    disk_gb: float | None = Field(None, gt=0, description="Disk the run directory may use, in GB: a config whose "
                                  "run would write more (checkpoints, step records, Redis' AOF: pcl plan) is "
                                  "refused; unset: printed, not checked.")


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
