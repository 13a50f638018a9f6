"""The `selection:` section of a run config: one pydantic model per selection strategy, and `Selection`, their
union discriminated on `type` (a new strategy's section goes here; `pcl.strategies` builds its registry from the
union). `single_round` marks a strategy whose step is one generation round: only those run asynchronous steps
(`run.max_staleness`)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Union

from pydantic import Field, model_validator

from pcl.config_base import Section


class UniformSelection(Section):
    """Plain GRPO: m prompts uniformly at random."""

    type: Literal["uniform"] = "uniform"
    single_round: ClassVar[bool] = True  # one generation round a step: run.max_staleness may generate it ahead


class PCLSelection(Section):
    """The value model picks the m of k*m candidates closest to tau."""

    type: Literal["pcl"] = "pcl"
    single_round: ClassVar[bool] = True
    tau: float = Field(0.5, ge=0, le=1, description="Target pass rate.")
    k: int = Field(4, ge=1, description="Candidate pool factor: k*m candidates are scored.")
    pipelined: bool = Field(False, description="Score step t+1's candidates while step t generates.")


class PrefilterSelection(Section):
    """Keep prompts whose reference-policy pass rate is strictly between p_low and p_high."""

    type: Literal["prefilter"] = "prefilter"
    single_round: ClassVar[bool] = True
    n_pre: int = Field(16, ge=1, description="Reference rollouts per prompt (the paper: 16).")
    p_low: float = Field(0.0, ge=0, le=1)
    p_high: float = Field(1.0, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> "PrefilterSelection":
        if self.p_low >= self.p_high:
            raise ValueError(f"p_low ({self.p_low}) must be below p_high ({self.p_high})")
        return self


class DynamicSamplingSelection(Section):
    """DAPO: generate for k*m prompts, keep those with 0 < p < 1, repeat until m (bounded)."""

    type: Literal["dynamic_sampling"] = "dynamic_sampling"
    k: int = Field(2, ge=1, description="Prompts generated per round, as a multiple of m (the paper: 2).")
    max_rounds: int = Field(16, ge=1, description="Safeguard: generation rounds before at_round_limit applies.")
    at_round_limit: Literal["shrink", "fill"] = Field("shrink", description="When max_rounds ends a step with fewer "
        "than m informative prompts (counted, logged): 'shrink' trains on those only (effective ratio 1); 'fill' "
        "pads the batch to m with zero-variance groups.")


class SpeedSelection(Section):
    """SPEED: n_init screening rollouts for k*m prompts, n - n_init more for the accepted ones."""

    type: Literal["speed"] = "speed"
    k: int = Field(2, ge=1, description="Candidates screened per round, as a multiple of m (the paper: 2).")
    n_init: int = Field(4, ge=1, description="Screening rollouts per candidate (below run.n).")
    max_rounds: int = Field(4, ge=2, description="Generation rounds per step (screening and continuation batched "
                            "together); the last continues the best available when fewer than m were accepted.")
    carry_over: bool = Field(True, description="The paper's SPEED: accepted prompts not continued in a step stay "
                             "buffered, with their screening samples, for the next step (off-policy by one step); "
                             "false: dropped at the end of the step (on-policy).")


class GresoSelection(Section):
    """GRESO: skip prompts that were all-correct / all-wrong, with adaptive probabilities."""

    type: Literal["greso"] = "greso"
    p_easy: float = Field(0.5, ge=0, le=1, description="Initial exploration probability of a prompt that was "
                          "all-correct: after s such steps in a row it is rolled out with probability p_easy**s.")
    p_hard: float = Field(0.5, ge=0, le=1, description="Initial exploration probability of an all-wrong prompt "
                          "(likewise p_hard**s).")
    delta_p: float = Field(0.01, gt=0, le=1, description="Adaptation step of p_easy / p_hard per step.")
    target_zero_variance: float = Field(0.25, ge=0, le=1, description="Target share of zero-variance prompts "
                                        "among those rolled out (a third all-correct, two thirds all-wrong).")
    k: float = Field(1.5, ge=1, description="Candidates drawn in a step's first round, as a multiple of m (the "
                     "paper: B_r^default = 768 prompts for m = 512, so 1.5).")
    max_rounds: int = Field(4, ge=1, description="Generation rounds before the batch is filled with the best available.")


class ProbeSelection(Section):
    """The paper's difficulty experiment: roll out k*m candidates n_probe times to estimate their pass rates,
    train on the m whose estimate is closest to target_p, with n fresh rollouts (the estimates are not reused)."""

    type: Literal["probe"] = "probe"
    target_p: float = Field(0.5, ge=0, le=1, description="Target pass rate of the trained prompts (the paper: 0, "
                            ".25, .5, .75, 1).")
    k: int = Field(4, ge=1, description="Candidates estimated each step, as a multiple of m.")
    n_probe: int = Field(8, ge=1, description="Estimation rollouts per candidate (not trained on).")


Selection = Annotated[
    Union[UniformSelection, PCLSelection, PrefilterSelection, DynamicSamplingSelection, SpeedSelection, GresoSelection,
          ProbeSelection],
    Field(discriminator="type"),
]
