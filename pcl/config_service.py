"""The service's sections of the run configuration (`pcl.config_schema` assembles them into `Config`): where the
run's state lives and how it is served (Redis, the control plane), checkpointed, evaluated, logged and sized
(`cluster`, for `pcl plan`). Every section rejects unknown keys and every number carries its allowed range.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pcl.config_base import Section
from pcl.config_urls import check_mlflow_uri, check_redis_url
from pcl.credentials import check_token


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
