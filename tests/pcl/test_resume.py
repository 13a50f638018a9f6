"""The resume precedence rule of pcl.loop.resume, on plain config sections and strategy states: a tunable setting
given with --resume overrides the checkpoint's state (and says so), a structural one that differs is refused
naming it, and nothing is dropped silently."""

from __future__ import annotations

import pytest

from pcl.config import DynamicSamplingSelection, GresoSelection, PCLSelection, ProbeSelection, dump_config, Config
from pcl.loop.resume import resolve_selection, resume_strategy, saved_selection
from pcl.strategies import make_strategy

SAVED = PCLSelection(tau=0.5, k=2).model_dump(mode="json")


def test_a_tunable_setting_given_with_resume_overrides_the_checkpoint_state_loudly():
    plan = resolve_selection(PCLSelection(tau=0.4, k=2), SAVED, {"tau": 0.5, "k": 2}, step=40)
    assert plan.overrides == {"tau": 0.4}
    assert plan.notes == ["selection.tau: 0.4 given with --resume overrides 0.5 from checkpoint step 40"]


def test_an_override_also_wins_over_a_value_the_control_plane_set_before_the_checkpoint():
    plan = resolve_selection(PCLSelection(tau=0.4, k=2), SAVED, {"tau": 0.3, "k": 2}, step=40)
    assert plan.overrides == {"tau": 0.4}
    assert plan.notes == ["selection.tau: 0.4 given with --resume overrides 0.3 from checkpoint step 40"]


def test_without_an_override_the_checkpoint_state_stands_and_a_live_change_is_named():
    plan = resolve_selection(PCLSelection(tau=0.5, k=2), SAVED, {"tau": 0.3, "k": 2}, step=40)
    assert plan.overrides == {}
    assert len(plan.notes) == 1 and plan.notes[0].startswith("selection.tau: 0.3 from checkpoint step 40 stands")
    assert resolve_selection(PCLSelection(tau=0.5, k=2), SAVED, {"tau": 0.5, "k": 2}, step=40).notes == []


def test_a_changed_selection_type_or_adapted_setting_is_refused_naming_it():
    with pytest.raises(ValueError, match="selection.type is 'uniform'; the checkpoint's run had 'pcl'"):
        resolve_selection({"type": "uniform"}, SAVED, {"tau": 0.5, "k": 2}, step=40)
    saved = GresoSelection().model_dump(mode="json")
    with pytest.raises(ValueError, match=r"selection.p_easy is 0.3; the checkpoint's run started from 0.5, which "
                                         r"greso has adapted to 0.47 by step 8"):
        resolve_selection(GresoSelection(p_easy=0.3), saved, {"p_easy": 0.47, "p_hard": 0.5}, step=8)
    # k of a strategy that keeps no k in its state: the override is the config's, and still said
    plan = resolve_selection(DynamicSamplingSelection(k=3), DynamicSamplingSelection(k=2).model_dump(), {}, 8)
    assert plan.overrides == {"k": 3} and plan.notes == ["selection.k: 3 given with --resume overrides 2 from "
                                                          "checkpoint step 8"]


def test_resume_strategy_loads_the_state_then_applies_the_override(tmp_path, caplog):
    (tmp_path / "config.yaml").write_text(dump_config(Config(selection=PCLSelection(tau=0.5, k=2))))
    assert saved_selection(tmp_path)["tau"] == 0.5 and saved_selection(tmp_path / "none") == {}
    strategy = make_strategy(PCLSelection(tau=0.4, k=2), 8, n=4)
    plan = resume_strategy(strategy, {"tau": 0.3, "k": 4}, PCLSelection(tau=0.4, k=2), tmp_path, step=12)
    assert (strategy.tau, strategy.k) == (0.4, 4)  # tau overridden, the checkpoint's live k=4 kept
    assert plan.overrides == {"tau": 0.4} and "overrides 0.3 from checkpoint step 12" in caplog.text
    probe = make_strategy(ProbeSelection(target_p=0.75), 8, n=4)
    (tmp_path / "config.yaml").write_text(dump_config(Config(selection=ProbeSelection(target_p=0.5))))
    resume_strategy(probe, {"target_p": 0.5, "k": 4}, ProbeSelection(target_p=0.75), tmp_path, step=3)
    assert probe.target_p == 0.75
