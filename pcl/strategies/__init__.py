"""Selection strategies: which prompts each step trains on, as stateful plugins behind one interface.

    cls = strategy_class(cfg.selection)               # what it needs, without building one: cls.needs_values
    strategy = make_strategy(cfg.selection, m=cfg.run.m, seed=cfg.run.seed, n=cfg.run.n)
    strategy.tune(tau=0.4)                            # the control plane's only way in: validated, from next step

The loop's view of a strategy (`StepStrategy`) and the base class are in `pcl.strategies.base`; one module per
strategy (docs/strategies.md lists them). The registry, `STRATEGIES` (selection.type -> class), is derived from
the config's `Selection` union: each section in the union has exactly one strategy class in this package whose
`config` is that section, and its name is the section's `type`. A new strategy is its module here and its
section in the union (`pcl/config_selection.py`); nothing else names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, get_args

from pcl.config_selection import Selection
from pcl.strategies.base import Needs, Request, Rollout, StepStrategy, Strategy, Tunable

__all__ = ["Needs", "Request", "Rollout", "StepStrategy", "Strategy", "Tunable", "STRATEGIES", "strategy_class",
           "strategy_registry", "make_strategy", "check_strategy"]


def _strategy_classes() -> list[type[Strategy]]:
    """Every strategy class of this package's modules (imported here), those with a `config` section."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found, todo = [], list(Strategy.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if cls.__dict__.get("config") is not None and cls.__module__.startswith(f"{__name__}."):
            found.append(cls)
    return found


def strategy_registry(union: Any = Selection) -> dict[str, type[Strategy]]:
    """selection.type -> strategy class, in the union's order: a TypeError names a section without a strategy
    class, or a strategy class whose section is not in the union."""
    sections = get_args(get_args(union)[0])
    classes = _strategy_classes()
    by_section = {cls.config: cls for cls in classes}
    missing = [s.__name__ for s in sections if s not in by_section]
    if missing:
        raise TypeError(f"{', '.join(missing)}: no strategy class in pcl/strategies/ has it as its `config`")
    orphans = [f"{cls.__name__}'s config {cls.config.__name__}" for cls in classes if cls.config not in sections]
    if orphans:
        raise TypeError(f"{'; '.join(orphans)} is not in the selection union (pcl/config_selection.py, Selection)")
    return {s.model_fields["type"].default: by_section[s] for s in sections}


# selection.type -> the strategy class, derived from the config's union.
STRATEGIES: dict[str, type[Strategy]] = strategy_registry()


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
