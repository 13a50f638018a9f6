"""The resume rule, here and only here: what a resumed run must share with its checkpoint's run, and where each of
its selection settings comes from.

    overrides = check_resumable(cfg, checkpoint, train_prompts)   # ConfigError naming every difference

`RESUME_FIXED` settings (run name, seed, m, n, dataset, revision, policy) must equal the checkpoint run's; the
training set must be the one the sampler's saved position indexes (`pcl.data.fingerprint.data_changes`); the
selection settings follow the rule below; anything else may change on resume.

`pcl train CONFIG --resume [key=value ...]` meets a selection setting in up to three places: the resumed run's
config (its files and command-line overrides), the checkpoint's strategy state (which holds what the control
plane changed before the checkpoint), and the control plane's hash in Redis (changes asked for since). The
rule, per kind of setting (docs/operations.md, "Resuming: where each setting comes from"):

    structural  selection.type, and the settings a strategy adapts as it trains (`Strategy.adapted`: GRESO's
                p_easy, p_hard, whose config value is only the starting point): the resumed config must keep
                the checkpoint run's value; a different one is refused, naming the setting, before anything
                starts.
    tunable     the strategy's `tunable` settings (pcl: tau, k; probe: target_p, k; dynamic_sampling, speed,
                greso: k):
                1. a value in the resumed config that differs from the one the checkpoint's run was configured
                   with is an explicit override: it wins over the checkpoint's strategy state and over the
                   control plane's hash (the driver sets the hash to it, with a `params_overridden` event);
                2. otherwise the checkpoint's strategy state stands;
                3. a control-plane change made after the checkpoint (Redis kept it) then applies at the first
                   step boundary, like every control change (a `params_applied` event).
                Every value that is not the config's is printed with where it came from.
    other       (max_rounds, n_init, n_probe, pipelined, ...): the strategy is built from the resumed config and
                nothing else holds them, so its value is used.

    plan = resolve_selection(cfg.selection, saved_selection, state["strategy"], step=40)   # ValueError: refused
    plan.overrides     # {"tau": 0.4}: tune the strategy after loading its state
    plan.notes         # ["selection.tau: 0.4 given with --resume overrides 0.5 from checkpoint step 40"]
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcl.config_schema import Config, ConfigError
from pcl.data.fingerprint import data_changes
from pcl.strategies import Strategy, strategy_class

log = logging.getLogger(__name__)


@dataclass
class ResumePlan:
    overrides: dict[str, Any] = field(default_factory=dict)  # tunable settings the resumed config overrides
    notes: list[str] = field(default_factory=list)  # one line per setting whose value is not simply the config's


def _dump(selection) -> dict[str, Any]:
    return selection if isinstance(selection, dict) else selection.model_dump(mode="json")


def resolve_selection(selection, saved: dict[str, Any], state: dict[str, Any], step: int | None) -> ResumePlan:
    """The resumed run's selection settings by the rule above. `selection`: the resumed config's section;
    `saved`: the checkpoint run's section (its config.yaml); `state`: the checkpoint's strategy state; `step`:
    the checkpoint's step (for the messages). A ValueError names every refused setting."""
    now, saved = _dump(selection), dict(saved or {})
    if saved.get("type") is not None and now["type"] != saved["type"]:
        raise ValueError(f"selection.type is {now['type']!r}; the checkpoint's run had {saved['type']!r} (a "
                         f"strategy's state cannot continue as another's: start a new run)")
    cls: type[Strategy] = strategy_class(now["type"])
    refused = [f"selection.{key} is {now[key]!r}; the checkpoint's run started from {saved[key]!r}, which "
               f"{cls.name} has adapted to {state.get(key)!r} by step {step}: a resumed run continues the adapted "
               f"value (start a new run to change it)"
               for key in cls.adapted if key in saved and now.get(key) != saved[key]]
    if refused:
        raise ValueError("\n".join(refused))
    plan = ResumePlan()
    for key in cls.tunable:
        given, configured, kept = now.get(key), saved.get(key, now.get(key)), state.get(key)
        checkpoint = kept if kept is not None else configured
        if given != configured:
            plan.overrides[key] = given
            if given != checkpoint:
                plan.notes.append(f"selection.{key}: {given!r} given with --resume overrides {checkpoint!r} from "
                                  f"checkpoint step {step}")
        elif kept is not None and kept != given:
            plan.notes.append(f"selection.{key}: {kept!r} from checkpoint step {step} stands (changed through the "
                              f"control plane); the config's {given!r} is the run's starting value (give another "
                              f"selection.{key} with --resume to override it)")
    return plan


def saved_selection(checkpoint: str | Path) -> dict[str, Any]:
    """The selection section of the run that wrote `checkpoint` (its config.yaml; {} when it has none)."""
    import yaml

    path = Path(checkpoint) / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}).get("selection", {}) if path.is_file() else {}


def resume_strategy(strategy: Strategy, state: dict[str, Any], selection, checkpoint: str | Path,
                    step: int) -> ResumePlan:
    """Load the checkpoint's strategy state into `strategy`, then apply the resumed config's overrides (`tune`),
    logging each setting whose value is not the config's. Returns the plan applied."""
    plan = resolve_selection(selection, saved_selection(checkpoint), state, step)
    strategy.load_state_dict(state)
    strategy.tune(**plan.overrides)
    for note in plan.notes:
        log.warning("%s", note)
    return plan


# What a resumed run must share with the run that wrote its checkpoint; the selection settings follow the rule
# above (structural ones fixed, tunable ones overridable); anything else may change on resume.
RESUME_FIXED = ("run.name", "run.seed", "run.m", "run.n", "data.source", "data.revision", "model.path")


def fixed_differences(now: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    """One line per RESUME_FIXED setting of the resumed config (`now`, dumped) that the checkpoint's run did not have."""
    problems = []
    for key in RESUME_FIXED:
        section, name = key.split(".")
        if saved.get(section, {}).get(name) != now[section][name]:
            problems.append(f"{key} is {now[section][name]!r}; the checkpoint's run had "
                            f"{saved.get(section, {}).get(name)!r}")
    return problems


def check_resumable(cfg: Config, checkpoint: Path, train: list) -> dict[str, Any]:
    """A ConfigError naming each difference that makes `checkpoint` meaningless for `cfg` and its training
    set `train` (a RESUME_FIXED setting, the prompt count and the data fingerprint of ids, questions and answers
    in order), or a selection setting the checkpoint cannot take. Prints where each selection setting that is
    not simply the config's comes from, and returns the tunable ones the resumed config overrides."""
    import yaml

    saved = yaml.safe_load((Path(checkpoint) / "config.yaml").read_text())
    problems = fixed_differences(cfg.model_dump(mode="json"), saved)
    state = json.loads((Path(checkpoint) / "state.json").read_text())
    plan = ResumePlan()
    try:
        plan = resolve_selection(cfg.selection, saved.get("selection", {}), state.get("strategy", {}),
                                 state.get("step"))
    except ValueError as exc:
        problems += str(exc).splitlines()
    problems += [f"{why} (the data changed)" for why in data_changes(state["sampler"], train)]
    if problems:
        raise ConfigError(f"cannot resume from {checkpoint}:\n  " + "\n  ".join(problems))
    for note in plan.notes:
        print(f"pcl: {note}", flush=True)
    return plan.overrides
