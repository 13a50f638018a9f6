"""The step record: one training step's figures, declared once, from which every reader takes its keys.

    record = StepRecord(step=3, effective_ratio=0.5, ...)     # what `StepLoop.train_step` returns
    line = record.to_dict()                                   # a line of RUN_DIR/metrics.jsonl (same key names)
    record = StepRecord.from_dict(json.loads(line))           # and back (old run directories included)

Each field carries how it is shown (`Figure`): its help text, its Prometheus kind (`gauge`: the last step's value;
`counter`: a cumulative count whose increments the control plane totals; `histogram`: seconds per step, bucketed;
`status`: served from the run's status rather than the step) and, for a dict-valued field such as a per-worker
count `{worker_id: count}`, the label its keys go under. The Prometheus metrics (`services.control.metrics`),
the control history (`services.control.state`), the trackers (`services.tracking`), the runlog
(`pcl.loop.runlog`), the plots and the dashboard (which reads `GET /v1/fields`) all derive their keys from
`FIGURES`, so a new step metric is a new field here and nothing else.

Figures without a field of their own (a strategy's own, e.g. `speed_rounds`, `tau`; the benchmark suite's
`suite_<name>`; anything a port adds) travel in `extra` and are written flat beside the fields: metrics.jsonl, the
control history and the trackers carry them by their names; Prometheus serves the fields only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

Kind = Literal["gauge", "counter", "histogram", "status"]


@dataclass(frozen=True)
class Figure:
    """How one field of the step record is shown. `every_step`: a training step's line always has the key (null
    when there is no value); other fields are written only when set. `label`: a dict-valued field's label name."""

    name: str
    help: str
    kind: Kind = "gauge"
    every_step: bool = False
    label: str | None = None
    title: str = ""  # a short axis or panel title (the help text where empty)

    @property
    def prometheus_name(self) -> str:
        """The family's name on /metrics (a counter's exposition adds `_total` back)."""
        return f"pcl_{self.name.removesuffix('_total')}" if self.kind == "counter" else f"pcl_{self.name}"


def figure(help: str, kind: Kind = "gauge", *, every_step: bool = False, label: str | None = None,
           title: str = "") -> Any:
    """A field of the step record (None until set), with how it is shown."""
    return field(default=None, metadata={"figure": (help, kind, every_step, label, title)})


@dataclass
class StepRecord:
    """One step's figures (the keys of a line of metrics.jsonl). Every field is None until set."""

    step: int | None = figure("Training steps completed (the record's step: 1 is the first step).", "status",
                              every_step=True)
    policy_version: int | None = figure("Version of the policy the rollout workers serve.", "status",
                                        every_step=True)
    effective_ratio: float | None = figure("Fraction of the last step's samples with non-zero advantage.",
                                           every_step=True, title="effective ratio (non-zero advantage)")
    train_reward_mean: float | None = figure("Mean reward of the last step's training samples.", every_step=True,
                                             title="train reward (mean)")
    step_seconds: float | None = figure("Seconds per training step, end to end.", "histogram", every_step=True)
    reference_seconds: float | None = figure("Seconds generating the initial policy's reference pass rates "
                                             "(the first step of a run that needs them).")
    selection_seconds: float | None = figure("Seconds per step sampling, scoring and selecting prompts.",
                                             "histogram", every_step=True)
    generation_seconds: float | None = figure("Seconds per step generating and verifying the rollouts.",
                                              "histogram", every_step=True, title="generation time per step (s)")
    train_seconds: float | None = figure("Seconds per step training: the group-mean advantages, the policy's step "
                                         "and V's (beside it, or after it: value.train_beside_policy).",
                                         every_step=True)
    policy_train_seconds: float | None = figure(
        "Seconds per step the loop waited for the policy's own training step (the learner group's call, batch sent "
        "to figures back). Part of train_seconds; leaves out the advantages and V's step, except that V's step "
        "running beside it on shared cores may slow it.", every_step=True, title="policy step (s)")
    weight_sync_seconds: float | None = figure("Seconds per step pushing new weights to the rollout fleet.",
                                               "histogram", every_step=True)
    probe_seconds: float | None = figure("Seconds of the last step's generation spent on V's explained-variance "
                                         "probe.", every_step=True)
    selected_value_mean: float | None = figure("Mean value-model prediction V(x) of the last step's selected "
                                               "prompts.", every_step=True)
    value_explained_variance: float | None = figure("Explained variance of V against realised pass rates (recent "
                                                    "steps).", every_step=True, title="V's explained variance")
    selected_pass_rate_mean: float | None = figure("Mean realised pass rate of the last step's selected prompts.",
                                                   every_step=True)
    selected_reference_pass_rate_mean: float | None = figure(
        "Mean initial-policy pass rate of the last step's selected prompts (where known).", every_step=True,
        title="reference pass rate of selected prompts")
    generation_rounds: int | None = figure("Generation rounds of the last step.", every_step=True)
    samples_generated: int | None = figure("Samples generated for the last step's batch (rounds, not the probe).",
                                           every_step=True)
    probe_samples: int | None = figure("Samples generated only for V's explained-variance probe in the last step.",
                                       every_step=True)
    prefetch_hits: int | None = figure("Steps whose candidates were drawn and scored during the step before "
                                       "(pipelined selection), since the start of the run.", every_step=True)
    grad_norm: float | None = figure("Gradient norm of the last policy step (before clipping).", every_step=True)
    policy_loss: float | None = figure("Policy-gradient loss of the last step.", every_step=True)
    train_sequences: int | None = figure("Sequences of the last step's policy update (non-zero advantage).",
                                         every_step=True)
    policy_skipped: int | None = figure("1 when the learner skipped the last policy step (non-finite loss or "
                                        "gradient norm: the weights did not change), else 0.", every_step=True,
                                        title="policy step skipped")
    policy_skipped_steps_total: int | None = figure("Policy steps the learner skipped for a non-finite loss or "
                                                    "gradient norm (learner.max_skipped_steps in a row stop the run).",
                                                    "counter")
    learner_padding_ratio: float | None = figure("Padding's share of the tokens the last policy step computed "
                                                 "(micro-batches are padded to their longest sequence).",
                                                 every_step=True)
    batch_samples: int | None = figure("Samples of the last step's batch (m * n).", every_step=True)
    batch_unique_samples: int | None = figure("Distinct (prompt, sample index) pairs of the last step's batch.",
                                              every_step=True)
    value_loss: float | None = figure("V's loss on the last step's batch.")
    value_grad_norm: float | None = figure("Gradient norm of V's last step.")
    value_num_prompts: float | None = figure("Prompts of V's last step.")
    value_skipped: float | None = figure("1 when V's last step was skipped (non-finite gradient), else 0.")
    value_train_seconds: float | None = figure("Seconds of V's last step.")
    # -- the curriculum (pcl.loop.curriculum_window): V's calibration, the pool, the gain over uniform selection --
    value_version: int | None = figure("Policy version whose rollouts V had last trained on when it scored the last "
                                       "step's candidates.", title="V's version")
    value_lag: int | None = figure("Policy version that generated the last step's batch minus V's version (1: V one "
                                   "step behind; more with pipelined selection or asynchronous steps).",
                                   title="V's lag (versions)")
    probe_brier: float | None = figure("Brier score of V on its random probe, last curriculum.window steps: mean "
                                       "(V - p)^2 against the realised pass rates.", title="V's Brier score (probe)")
    probe_calibration_error: float | None = figure(
        "Expected calibration error of V on its random probe, last curriculum.window steps: |mean V - mean p| "
        "over fixed bins of V, weighted by prompts.", title="V's calibration error (probe)")
    probe_brier_by_lag: dict[str, float] | None = figure("V's Brier score on its probe, by V's lag.", label="lag",
                                                         title="V's Brier score by lag (probe)")
    probe_calibration_error_by_lag: dict[str, float] | None = figure(
        "V's calibration error on its probe, by V's lag.", label="lag", title="V's calibration error by lag (probe)")
    probe_reliability_predicted: dict[str, float] | None = figure(
        "Reliability table of V's probe: mean V by bin of V.", label="bin", title="reliability: mean V (probe)")
    probe_reliability_realized: dict[str, float] | None = figure(
        "Reliability table of V's probe: mean realised pass rate by bin of V.", label="bin",
        title="reliability: realised pass rate (probe)")
    probe_reliability_count: dict[str, int] | None = figure(
        "Reliability table of V's probe: prompts by bin of V.", label="bin", title="reliability: prompts (probe)")
    trained_brier: float | None = figure("Brier score of V on the trained prompts, last curriculum.window steps.",
                                         title="V's Brier score (trained)")
    trained_calibration_error: float | None = figure(
        "Expected calibration error of V on the trained prompts, last curriculum.window steps.",
        title="V's calibration error (trained)")
    trained_brier_by_lag: dict[str, float] | None = figure("V's Brier score on the trained prompts, by V's lag.",
                                                           label="lag", title="V's Brier score by lag (trained)")
    trained_calibration_error_by_lag: dict[str, float] | None = figure(
        "V's calibration error on the trained prompts, by V's lag.", label="lag",
        title="V's calibration error by lag (trained)")
    trained_reliability_predicted: dict[str, float] | None = figure(
        "Reliability table of the trained prompts: mean V by bin of V.", label="bin",
        title="reliability: mean V (trained)")
    trained_reliability_realized: dict[str, float] | None = figure(
        "Reliability table of the trained prompts: mean realised pass rate by bin of V.", label="bin",
        title="reliability: realised pass rate (trained)")
    trained_reliability_count: dict[str, int] | None = figure(
        "Reliability table of the trained prompts: prompts by bin of V.", label="bin",
        title="reliability: prompts (trained)")
    pool_histogram: dict[str, int] | None = figure("Candidates V scored in the last step, by bin of V (the k*m "
                                                   "pool).", label="bin", title="pool: candidates by V")
    selected_band_width: float | None = figure("Largest |V - tau| among the last step's selected prompts (PCL "
                                               "took every candidate within it).", title="selected band (max |V - tau|)")
    expected_effective_ratio: float | None = figure("Effective ratio V expected of the last step's selected prompts: "
                                                    "mean of 1 - V^n - (1 - V)^n.", title="effective ratio V expected")
    uniform_effective_ratio: float | None = figure(
        "Effective ratio realised on V's random probes of the last curriculum.window steps: what uniform "
        "selection would have trained on.", title="effective ratio of uniform selection (probe)")
    curriculum_gain: float | None = figure(
        "Mean effective ratio of the last curriculum.window steps' batches minus the uniform counterfactual "
        "(uniform_effective_ratio): what the selection buys.", title="curriculum gain over uniform")
    expectation_gap: float | None = figure("Effective ratio V expected of its selections minus the realised, last "
                                           "curriculum.window steps.", title="expected minus realised effective ratio")
    curriculum_stalled: int | None = figure(
        "Steps in a row the curriculum has been stalled (its gain below curriculum.min_gain for "
        "curriculum.patience steps or more); 0 while it pays.", title="curriculum stalled (steps in a row)")
    curriculum_stalled_steps_total: int | None = figure("Steps the curriculum spent stalled, since the start of the "
                                                        "run.", "counter")
    rollout_samples_by_worker: dict[str, int] | None = figure(
        "Samples each rollout worker generated for the last step (its rounds and V's probe).", label="worker",
        title="samples by rollout worker")
    rollout_logprob_gap_mean: float | None = figure(
        "Mean |log p_engine - log p_learner| over the last step's trained tokens (the on-policy gap).",
        title="engine-learner log-prob gap (mean)")
    rollout_logprob_gap_max: float | None = figure(
        "Largest |log p_engine - log p_learner| over the last step's trained tokens.",
        title="engine-learner log-prob gap (max)")
    importance_ratio_mean: float | None = figure(
        "Mean importance ratio pi_learner / pi_engine over the last step's trained tokens (with an off-policy "
        "correction, learner.off_policy).", title="importance ratio (mean)")
    importance_ratio_max: float | None = figure(
        "Largest importance ratio pi_learner / pi_engine over the last step's trained tokens (with an off-policy "
        "correction).", title="importance ratio (max)")
    importance_ratio_clipped_share: float | None = figure(
        "Share of the last step's trained tokens whose importance ratio exceeded learner.off_policy.cap (weighted "
        "at the cap).", title="importance ratio clipped share")
    batch_staleness: int | None = figure("Policy versions between the one that generated the last step's batch "
                                         "and the learner's (0: synchronous; run.max_staleness bounds it).",
                                         title="batch staleness (versions)")
    learner_wait_seconds: float | None = figure("Seconds the learner waited after its step for the batch generated "
                                                "ahead (asynchronous steps).", title="learner waiting for data (s)")
    fleet_wait_seconds: float | None = figure("Seconds the rollout fleet sat idle after generating ahead, waiting "
                                              "for the learner's new weights (asynchronous steps).",
                                              title="fleet waiting for weights (s)")
    worker_reloads: int | None = figure("Weights given again to a rollout worker that lacked them (restarted, or "
                                        "left behind by a weight sync while it made no progress), since the start "
                                        "of the run.", "counter")
    dropped_duplicates: int | None = figure("Rollout results dropped as duplicates.", "counter")
    dropped_stale_step: int | None = figure("Rollout results dropped as left over from an earlier step.", "counter")
    dropped_stale_version: int | None = figure("Rollout results dropped as generated by an older policy.",
                                               "counter")
    dropped_unexpected: int | None = figure("Rollout results dropped as not asked for.", "counter")
    dropped_unresolved: int | None = figure("Rollout results dropped unresolved.", "counter")
    dropped_stale_by_producer: dict[str, int] | None = figure(
        "Rollout results dropped as stale (left over from an earlier step, or generated by an older policy), by the "
        "worker and process that generated them, 'rollout-1@<incarnation>' (the run's incarnation registry names "
        "each incarnation's node).", "counter", label="producer", title="stale results dropped, by producer")
    dropped_late_by_verifier: dict[str, int] | None = figure(
        "Reward notes dropped as stale or as a second copy, by the verifier that wrote them, "
        "'verifier-0@<incarnation>' (a verifier that froze writes late).", "counter", label="verifier",
        title="late reward notes dropped, by verifier")
    handed_over_by_worker: dict[str, int] | None = figure(
        "Samples handed from a worker without progress for its straggler timeout to the live workers, by the "
        "worker they were taken from ('rollout-0', 'verifier-1').", "counter", label="worker",
        title="samples handed over from stragglers")
    stuck_restarts_by_worker: dict[str, int] | None = figure(
        "Workers restarted for making no progress for their stuck timeout, by worker.", "counter", label="worker",
        title="stuck workers restarted")
    dead_letters: int | None = figure("Entries moved to the work streams' dead-letter streams.", "counter")
    samples_total: int | None = figure("Verified samples generated (training, value probes and evaluation).",
                                       "counter")
    generated_tokens_total: int | None = figure("Response tokens generated by the rollout fleet.", "counter")
    verifier_timeouts_total: int | None = figure("Samples whose math-verify check hit the hard timeout (reward 0).",
                                                 "counter")
    verifier_errors_total: int | None = figure("Samples the verifier could not score (a worker error on two "
                                               "workers, or a worker's death): reward 0.", "counter")
    eval_accuracy: float | None = figure("Held-out accuracy at the last evaluation.", "status",
                                         title="held-out accuracy")
    eval_accuracy_se: float | None = figure("Standard error over prompts of the last held-out accuracy.")
    suite_average: float | None = figure("Mean avg@k over the evaluation suite's benchmarks at the last suite "
                                         "evaluation.")
    elapsed_seconds: float | None = figure("Wall-clock seconds of the run so far, pauses excluded.")
    train_elapsed_seconds: float | None = figure("Seconds of training so far (evaluations, checkpoint writes and "
                                                 "pauses excluded).")
    extra: dict[str, Any] = field(default_factory=dict)  # figures without a field of their own, written flat

    # -- conversion ------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "StepRecord":
        """A record from a metrics.jsonl line (or any dict of figures): known keys to their fields, the rest to
        `extra`."""
        known = {k: v for k, v in record.items() if k in _FIELDS}
        return cls(**known, extra={k: v for k, v in record.items() if k not in _FIELDS and k != "extra"})

    @classmethod
    def coerce(cls, record: "StepRecord | dict[str, Any]") -> "StepRecord":
        return record if isinstance(record, StepRecord) else cls.from_dict(record)

    @property
    def is_training_step(self) -> bool:
        """Whether this is a training step's record (not the evaluation before the first step)."""
        return self.step_seconds is not None

    def to_dict(self) -> dict[str, Any]:
        """The metrics.jsonl line: the set fields (and, on a training step, every `every_step` field, null when
        unset), then `extra` flat."""
        training = self.is_training_step
        out = {name: self.get(name) for name, fig in FIGURES.items()
               if self.get(name) is not None or (training and fig.every_step)}
        out.update((k, v) for k, v in self.extra.items() if k not in out)
        return out

    def update(self, figures: dict[str, Any]) -> None:
        """Set figures by name: known ones on their fields, the rest in `extra`."""
        for name, value in figures.items():
            if name in _FIELDS:
                setattr(self, name, value)
            else:
                self.extra[name] = value

    def __getitem__(self, name: str) -> Any:
        """A figure by its metrics.jsonl name, as the line has it (KeyError where the line has no such key)."""
        return self.to_dict()[name]

    def __contains__(self, name: object) -> bool:
        return name in self.to_dict()

    def get(self, name: str, default: Any = None) -> Any:
        """A figure by its metrics.jsonl name (a field or an `extra` key)."""
        value = getattr(self, name) if name in _FIELDS else self.extra.get(name)
        return default if value is None else value


def _figures() -> dict[str, Figure]:
    out = {}
    for f in fields(StepRecord):
        if "figure" in f.metadata:
            help_, kind, every_step, label, title = f.metadata["figure"]
            out[f.name] = Figure(f.name, help_, kind, every_step, label, title)
    return out


_FIELDS = frozenset(f.name for f in fields(StepRecord) if f.name != "extra")
FIGURES: dict[str, Figure] = _figures()  # every field of the step record, in order, with how it is shown
STEP_KEYS = tuple(name for name, fig in FIGURES.items() if fig.every_step)  # the keys every training step carries


def check_keys(keys, where: str) -> None:
    """A ValueError when `where` names a key the step record does not declare (a typo, or a renamed field)."""
    unknown = [k for k in keys if k not in FIGURES]
    if unknown:
        raise ValueError(f"{where}: {', '.join(unknown)} is not a field of pcl.loop.record.StepRecord")


def title(name: str) -> str:
    """A field's short title (its help text when it has none)."""
    fig = FIGURES[name]
    return fig.title or fig.help
