"""The curriculum's figures of each step, pooled over the last `curriculum.window` steps, and the warning when the
gain over uniform selection stays low (`curriculum.min_gain` for `curriculum.patience` steps).

    window = CurriculumWindow(cfg.curriculum, n=cfg.run.n)    # LoopState.curriculum, kept in state.json
    figures = window.add(step, batch, pass_rates, effective_ratio, k)   # step record fields (none without V)
    window.write_tables(run_dir)                              # the reliability tables: RUN_DIR/calibration.json

Each step adds what V predicted and what was realised, for V's random probe (unbiased by the selection) and for
the trained prompts (where the selection crowds the bins near tau), tagged with V's lag: the policy version that
generated the batch minus the one whose rollouts V had last trained on when it scored the batch (1 in synchronous
steps: V is one step behind; 2 with pipelined selection; max_staleness + 1 with asynchronous steps). The figures
(`pcl.loop.curriculum` computes them) pool the window's steps: a single probe of 32 prompts is noisy.

The gain is the realised effective ratio of the window's trained batches minus the uniform counterfactual, the
effective ratio realised on the window's probes (random prompts, n rollouts each, the same policy): what the
selection bought, measured, not predicted. Beside it, `expectation_gap` is what V expected of its selections
(1 - V^n - (1 - V)^n per prompt) minus what they realised: V's miscalibration where it matters.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcl.loop.curriculum import (
    BINS, ReliabilityRow, band_width, bin_label, brier_score, calibration_error, expected_effective_ratio,
    realized_effective_ratio, reliability_table,
)
from pcl.loop.record import check_keys
from pcl.loop.rounds import StepBatch

log = logging.getLogger(__name__)

ADVICE = ("raise k (PATCH /v1/params {\"k\": ...}: a larger pool holds more prompts near tau), move tau, or switch "
          "selection.type (uniform spends nothing on V)")
SETS = ("probe", "trained")  # V's random probe, and the prompts the selection trained on
CALIBRATION_FILE = "calibration.json"  # the window's reliability tables, rewritten after each step


@dataclass
class Observed:
    """One step's predictions and realised pass rates."""

    step: int  # the record's step (1 is the first)
    lag: int | None  # V's lag when it scored the batch (None: V had not trained yet)
    probe: tuple[list[float], list[float]]  # (V, p) of the probe's prompts
    trained: tuple[list[float], list[float]]  # (V, p) of the trained prompts
    effective_ratio: float  # realised, of the trained batch
    expected: float | None  # the effective ratio V expected of the trained batch

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "lag": self.lag, "probe": [list(x) for x in self.probe],
                "trained": [list(x) for x in self.trained], "effective_ratio": self.effective_ratio,
                "expected": self.expected}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Observed":
        v, p = d["probe"]
        tv, tp = d["trained"]
        return cls(int(d["step"]), None if d["lag"] is None else int(d["lag"]), (list(v), list(p)),
                   (list(tv), list(tp)), float(d["effective_ratio"]),
                   None if d["expected"] is None else float(d["expected"]))


@dataclass
class CurriculumWindow:
    """The last `window` steps' observations and the low-gain count (see the module docstring)."""

    window: int = 16
    n: int = 8
    bins: int = BINS
    min_gain: float | None = 0.05
    patience: int = 20
    steps: list[Observed] = field(default_factory=list)
    below: int = 0  # steps in a row with the gain below min_gain
    stalled_total: int = 0  # steps spent stalled (the gain below min_gain for patience steps or more)

    @classmethod
    def from_config(cls, curriculum, n: int) -> "CurriculumWindow":
        """From the run's `curriculum:` section (`pcl.config.CurriculumConfig`), for n responses per prompt."""
        return cls(curriculum.window, n, curriculum.bins, curriculum.min_gain, curriculum.patience)

    def add(self, step: int, batch: StepBatch, pass_rates: np.ndarray, effective_ratio: float,
            k: int | None = None) -> dict[str, Any]:
        """Step `step`'s (its record's number) observations in, the window's figures out: step record fields, none
        when V scored nothing this step (a strategy without V). The step the gain has stayed below min_gain for
        `patience` steps, a warning names the strategy's tau and `k` and what to change."""
        if not batch.values:
            return {}
        trained = [(batch.values[i], float(p)) for i, p in zip(batch.ids, pass_rates) if i in batch.values]
        probe = [(batch.values[i], p) for i, p in zip(batch.probe_ids, batch.probe_rates)]
        lag = None if batch.value_version is None else batch.version - batch.value_version
        selected = [v for v, _ in trained]
        self.steps = [o for o in self.steps if o.step > step - self.window] + [Observed(
            step, lag, _columns(probe), _columns(trained), effective_ratio, expected_effective_ratio(selected, self.n))]
        figures = {
            "value_version": batch.value_version, "value_lag": lag,
            "pool_histogram": {bin_label(b / self.bins, (b + 1) / self.bins): c for b, c in enumerate(batch.pool)},
            "selected_band_width": band_width(selected, batch.tau) if batch.tau is not None else None,
            "expected_effective_ratio": self.steps[-1].expected,
        }
        figures.update(self.calibration())
        figures.update(self.gain())
        if figures["curriculum_stalled"] == 1:
            log.warning("step %d: %s", step, self.stall_message(figures["curriculum_gain"], batch.tau, k))
        return figures

    def calibration(self) -> dict[str, Any]:
        """Brier score, calibration error and reliability table of each set over the window, and by V's lag."""
        out: dict[str, Any] = {}
        for name in SETS:
            v, p = self.pooled(name)
            if not v:
                continue
            rows = reliability_table(v, p, self.bins)
            out[f"{name}_brier"], out[f"{name}_calibration_error"] = brier_score(v, p), calibration_error(rows)
            filled = [r for r in rows if r.count]
            out[f"{name}_reliability_predicted"] = {r.label: r.predicted for r in filled}
            out[f"{name}_reliability_realized"] = {r.label: r.realized for r in filled}
            out[f"{name}_reliability_count"] = {r.label: r.count for r in filled}
            lags = sorted({o.lag for o in self.steps if o.lag is not None and getattr(o, name)[0]})
            by_lag = {str(lag): self.pooled(name, lag) for lag in lags}
            if by_lag:
                out[f"{name}_brier_by_lag"] = {lag: brier_score(*vp) for lag, vp in by_lag.items()}
                out[f"{name}_calibration_error_by_lag"] = {
                    lag: calibration_error(reliability_table(*vp, self.bins)) for lag, vp in by_lag.items()}
        return out

    def gain(self) -> dict[str, Any]:
        """The uniform counterfactual, the gain over it, V's expectation gap, and the low-gain warning's count."""
        _, probe_rates = self.pooled("probe")
        uniform = realized_effective_ratio(probe_rates)
        realized = statistics.fmean(o.effective_ratio for o in self.steps)
        gain = None if uniform is None else realized - uniform
        expected = [(o.expected, o.effective_ratio) for o in self.steps if o.expected is not None]
        stalled = self.observe_gain(gain)
        return {"uniform_effective_ratio": uniform, "curriculum_gain": gain,
                "expectation_gap": statistics.fmean(e - r for e, r in expected) if expected else None,
                "curriculum_stalled": stalled, "curriculum_stalled_steps_total": self.stalled_total}

    def observe_gain(self, gain: float | None) -> int:
        """Count a step's gain against min_gain; returns the steps in a row spent stalled so far (0: paying). A step
        without a gain (no probe in the window) reports 0 and leaves the count as it was."""
        if self.min_gain is None or gain is None:
            return 0
        self.below = self.below + 1 if gain < self.min_gain else 0
        stalled = max(0, self.below - self.patience + 1)
        self.stalled_total += bool(stalled)
        return stalled

    def pooled(self, name: str, lag: int | None = None) -> tuple[list[float], list[float]]:
        """(V, p) of one set over the window's steps (those of one lag, when given)."""
        steps = [o for o in self.steps if lag is None or o.lag == lag]
        return ([v for o in steps for v in getattr(o, name)[0]], [p for o in steps for p in getattr(o, name)[1]])

    def tables(self) -> dict[str, Any]:
        """The reliability tables of the window, whole and by lag: what RUN_DIR/calibration.json holds."""
        def rows(v: list[float], p: list[float]) -> list[dict[str, Any]]:
            return [_row(r) for r in reliability_table(v, p, self.bins)]

        out: dict[str, Any] = {"steps": [o.step for o in self.steps], "bins": self.bins}
        for name in SETS:
            lags = sorted({o.lag for o in self.steps if o.lag is not None})
            out[name] = {"all": rows(*self.pooled(name)), **{f"lag {lag}": rows(*self.pooled(name, lag)) for lag in lags}}
        return out

    def write_tables(self, run_dir: str | os.PathLike) -> None:
        """RUN_DIR/calibration.json: `tables()`, replaced whole (nothing is written before V has scored a batch)."""
        if not self.steps:
            return
        path = os.path.join(run_dir, CALIBRATION_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            json.dump(self.tables(), out, indent=1)
        os.replace(path + ".tmp", path)

    def stall_message(self, gain: float, tau: float | None = None, k: int | None = None) -> str:
        """What a user reads when the curriculum stops paying: the figure, the settings, and what to change."""
        now = ", ".join(f"{key} = {value:g}" for key, value in (("tau", tau), ("k", k)) if value is not None)
        return (f"the curriculum is not paying: its gain over uniform selection (effective ratio over the last "
                f"{self.window} steps) has been below curriculum.min_gain = {self.min_gain:g} for {self.patience} "
                f"steps in a row, now {gain:+.3f}{f' ({now})' if now else ''}: {ADVICE}")

    def state_dict(self) -> dict[str, Any]:
        return {"steps": [o.to_dict() for o in self.steps], "below": self.below, "stalled_total": self.stalled_total}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """From `state_dict`'s output; empty where a checkpoint written before the window has none."""
        state = state or {}
        self.steps = [Observed.from_dict(d) for d in state.get("steps", [])]
        self.below, self.stalled_total = int(state.get("below", 0)), int(state.get("stalled_total", 0))


def _columns(pairs: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    return [float(v) for v, _ in pairs], [float(p) for _, p in pairs]


def _row(r: ReliabilityRow) -> dict[str, Any]:
    return {"bin": r.label, "predicted": r.predicted, "realized": r.realized, "count": r.count}


check_keys([f"{name}_{figure}" for name in SETS for figure in (
    "brier", "calibration_error", "reliability_predicted", "reliability_realized", "reliability_count",
    "brier_by_lag", "calibration_error_by_lag")], "pcl.loop.curriculum_window")
