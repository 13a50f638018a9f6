"""Selection strategies: which prompts each step trains on, as stateful plugins behind one interface.

    strategy = make_strategy(cfg.selection, m=cfg.run.m, seed=cfg.run.seed, n=cfg.run.n)

The round protocol (`begin_step`, `next_request`, `propose`, `observe`, `ready`, `finish_step`) is described
in `pcl.strategies.base`; every strategy keeps its state in `state_dict()` / `load_state_dict()` and reports
`metrics()`. One module per strategy:

    uniform            plain GRPO: m prompts from the sampler
    prefilter          reference-policy pass rates, keep p_low < p < p_high, then uniform
    dynamic_sampling   DAPO: roll out k*m, keep 0 < p < 1, repeat until m are kept (round-limit safeguard)
    speed              SPEED: n_init screening rollouts, n - n_init more for the accepted (carried across steps)
    greso              GRESO: dynamic sampling that skips prompts with all-equal reward histories
    pcl                the value model picks the m of k*m candidates closest to tau
"""

from __future__ import annotations

from pcl.config import (
    DynamicSamplingSelection,
    GresoSelection,
    PCLSelection,
    PrefilterSelection,
    SpeedSelection,
    UniformSelection,
)
from pcl.strategies.base import Request, Rollout, Strategy
from pcl.strategies.dynamic_sampling import DynamicSamplingStrategy
from pcl.strategies.greso import GresoStrategy
from pcl.strategies.prefilter import PrefilterStrategy
from pcl.strategies.prompt_curriculum import PCLStrategy
from pcl.strategies.speed import SpeedStrategy
from pcl.strategies.uniform import UniformStrategy

__all__ = ["Request", "Rollout", "Strategy", "make_strategy", "UniformStrategy", "PCLStrategy", "PrefilterStrategy",
           "DynamicSamplingStrategy", "SpeedStrategy", "GresoStrategy"]


def make_strategy(selection, m: int, seed: int = 0, *, n: int) -> Strategy:
    """The strategy object for a `selection` config section, for m prompts of n responses per step.

    Raises ValueError naming the keys when the section does not fit the run (for example speed's n_init >= n).
    """
    s = selection
    if isinstance(s, PCLSelection):
        return PCLStrategy(m, n, s.tau, s.k, s.pipelined)
    if isinstance(s, UniformSelection):
        return UniformStrategy(m, n)
    if isinstance(s, PrefilterSelection):
        return PrefilterStrategy(m, n, s.n_pre, s.p_low, s.p_high)
    if isinstance(s, DynamicSamplingSelection):
        return DynamicSamplingStrategy(m, n, s.k, s.max_rounds, s.at_round_limit)
    if isinstance(s, SpeedSelection):
        return SpeedStrategy(m, n, s.k, s.n_init, s.max_rounds, s.carry_over)
    if isinstance(s, GresoSelection):
        return GresoStrategy(m, n, s.k, s.max_rounds, s.p_easy, s.p_hard, s.delta_p, s.target_zero_variance, seed)
    raise ValueError(f"selection.type={getattr(s, 'type', s)!r} is not a known strategy")
