"""The service's sections of the run configuration (`pcl.config_schema` assembles them into `Config`): where the
run's state lives and how it is served (Redis, the control plane), checkpointed, evaluated, logged and sized
(`cluster`, for `pcl plan`). Every section rejects unknown keys and every number carries its allowed range.

The URL settings are checked by scheme before anything connects: `redis.url` (REDIS_URL) and
`logging.mlflow_tracking_uri` (MLFLOW_TRACKING_URI).

    check_redis_url("redis://:pw@host:6379/0")        # the URL, or ValueError saying what is wrong and the forms
    check_mlflow_uri("localhost:5000")                # ValueError: 'localhost' is no scheme MLflow stores runs in

A message never holds the URL itself (its password would go with it): `pcl.config` prints it masked beside the
key (`pcl.credentials.mask_url`).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Annotated, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import Field, field_validator, model_validator

from pcl.config_base import Section
from pcl.credentials import check_token

REDIS_FORMS = ("redis://[user:password@]host[:port][/db], rediss://... (TLS) or unix:///path/to/redis.sock[?db=N] "
               "(redis-py's URL forms)")

# The tracking stores MLflow builds itself (mlflow.tracking._tracking_service.utils): a local directory (a path, no
# scheme; `databricks` and `databricks-uc` alone read as such and are MLflow's too), file:, http(s)://, a
# Databricks profile (databricks://profile), Unity Catalog (databricks-uc, uc:), and the SQLAlchemy databases,
# each with an optional +driver (postgresql+psycopg2://). A plugin's schemes (entry point group
# mlflow.tracking_store) are taken as well.
MLFLOW_SCHEMES = ("file", "http", "https", "databricks", "databricks-uc", "uc")
MLFLOW_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
MLFLOW_FORMS = ("a local directory, file:///path, http(s)://host[:port], sqlite:///path.db, "
                "postgresql|mysql|mssql[+driver]://user:password@host[:port]/db, databricks[://profile], "
                "databricks-uc or uc:URL")


def _port(parts) -> None:
    try:
        parts.port
    except ValueError:  # not a number, or outside 0-65535
        raise ValueError("its port is not a number from 0 to 65535") from None


def check_redis_url(url: str) -> str:
    """`url` when redis-py can connect by it (the scheme, a host or socket path, the port, the database number);
    else ValueError naming the fault and the allowed forms."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        found = f"the scheme {parts.scheme!r} is not Redis's" if parts.scheme else "it has no scheme"
        raise ValueError(f"{found}; a Redis URL is {REDIS_FORMS}")
    try:
        _port(parts)
        if parts.scheme == "unix":
            if parts.hostname or not parts.path:
                raise ValueError("a unix:// URL names the server's socket by its absolute path (unix:///path, no "
                                 "host)")
            db = dict(parse_qsl(parts.query)).get("db", "0")
        else:
            if not parts.hostname:
                raise ValueError("it names no host")
            db = parts.path.strip("/") or "0"
        if not db.isdigit():
            raise ValueError(f"its database {db!r} is not a number")
    except ValueError as exc:
        raise ValueError(f"{exc}; a Redis URL is {REDIS_FORMS}") from None
    return url


def check_mlflow_uri(uri: str) -> str:
    """`uri` when it is a local directory or names a tracking store MLflow has (MLFLOW_SCHEMES, MLFLOW_DATABASES,
    a plugin's scheme) with a host where the store needs one; else ValueError naming the fault and the forms."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if not scheme:
        if not uri.strip():
            raise ValueError(f"it is blank; an MLflow tracking URI is {MLFLOW_FORMS}")
        return uri  # a local directory
    known = scheme in MLFLOW_SCHEMES or scheme.split("+")[0] in MLFLOW_DATABASES
    if not known and scheme not in {ep.name for ep in entry_points(group="mlflow.tracking_store")}:
        raise ValueError(f"the scheme {parts.scheme!r} is no tracking store of MLflow's; an MLflow tracking URI is "
                         f"{MLFLOW_FORMS}")
    try:
        _port(parts)
        if scheme in ("http", "https") and not parts.hostname:
            raise ValueError("it names no host")
    except ValueError as exc:
        raise ValueError(f"{exc}; an MLflow tracking URI is {MLFLOW_FORMS}") from None
    return uri


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
