"""Selection strategies: which prompts each step trains on, as stateful plugins behind one interface.

    cls = strategy_class(cfg.selection)               # what it needs, without building one: cls.needs_values
    strategy = make_strategy(cfg.selection, m=cfg.run.m, seed=cfg.run.seed, n=cfg.run.n)
    strategy.tune(tau=0.4)                            # the control plane's only way in: validated, from next step

The round protocol (`begin_step`, `next_request`, `propose`, `observe`, `ready`, `finish_step`) is described
in `pcl.strategies.base`; every strategy keeps its state in `state_dict()` / `load_state_dict()` and reports
`metrics()`. One module per strategy, each registered in STRATEGIES under its `selection.type`:

    uniform            plain GRPO: m prompts from the sampler
    prefilter          reference-policy pass rates, keep p_low < p < p_high, then uniform
    dynamic_sampling   DAPO: roll out k*m, keep 0 < p < 1, repeat until m are kept (round-limit safeguard)
    speed              SPEED: n_init screening rollouts, n - n_init more for the accepted (carried across steps)
    greso              GRESO: dynamic sampling that skips prompts with all-equal reward histories
    pcl                the value model picks the m of k*m candidates closest to tau
    probe              the paper's difficulty experiment: rollout estimates pick the m closest to target_p
"""

from __future__ import annotations

from pcl.strategies.base import Request, Rollout, Strategy, Tunable
from pcl.strategies.dynamic_sampling import DynamicSamplingStrategy
from pcl.strategies.greso import GresoStrategy
from pcl.strategies.prefilter import PrefilterStrategy
from pcl.strategies.probe import ProbeStrategy
from pcl.strategies.prompt_curriculum import PCLStrategy
from pcl.strategies.speed import SpeedStrategy
from pcl.strategies.uniform import UniformStrategy

__all__ = ["Request", "Rollout", "Strategy", "Tunable", "STRATEGIES", "strategy_class", "make_strategy",
           "check_strategy", "UniformStrategy", "PCLStrategy", "PrefilterStrategy", "DynamicSamplingStrategy",
           "SpeedStrategy", "GresoStrategy", "ProbeStrategy"]

# selection.type -> the strategy class: the one place a strategy is registered.
STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (
    UniformStrategy, PCLStrategy, PrefilterStrategy, DynamicSamplingStrategy, SpeedStrategy, GresoStrategy,
    ProbeStrategy)}


def strategy_class(selection) -> type[Strategy]:
    """The class registered for a `selection` section (or a selection.type name): its capabilities
    (`needs_values`, `uses_reference`, `tunable`) are read from it without building a strategy."""
    name = selection if isinstance(selection, str) else getattr(selection, "type", selection)
    cls = STRATEGIES.get(name)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"selection.type={name!r} is not a known strategy (known: {', '.join(STRATEGIES)})")
    return cls


def check_strategy(selection, m: int, *, n: int) -> type[Strategy]:
    """The strategy class of `selection`, after checking that the section fits a run of m prompts of n responses
    each; a ValueError names the keys when it does not (for example speed's n_init >= n)."""
    cls = strategy_class(selection)
    if not isinstance(selection, cls.config):
        raise ValueError(f"selection.type={cls.name!r} needs a {cls.config.__name__} section, got "
                         f"{type(selection).__name__}")
    cls.check_run(m, n, selection)
    return cls


def make_strategy(selection, m: int, seed: int = 0, *, n: int) -> Strategy:
    """The strategy object for a `selection` config section, for m prompts of n responses per step.

    Raises ValueError naming the keys when the section does not fit the run (for example speed's n_init >= n).
    """
    return check_strategy(selection, m, n=n).from_config(selection, m=m, n=n, seed=seed)
