"""`pcl train` refuses, before anything starts, a token budget below the longest sequence and a GPU config that
`pcl plan` says does not fit (with the plan's message); --ignore-plan trains anyway and logs it."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from pcl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "configs" / "presets" / "qwen3-8b-base-math.yaml"
TOO_BIG = ["learner.activation_checkpointing=false", "learner.max_tokens_per_micro_batch=32768"]


def _pcl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "entrypoints.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_a_token_budget_below_the_longest_sequence_is_refused_naming_both():
    done = _pcl("train", "configs/tiny.yaml", "learner.max_tokens_per_micro_batch=10")
    assert done.returncode == 2
    cfg = load_config(REPO / "configs" / "tiny.yaml")
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    assert (f"learner.max_tokens_per_micro_batch (10) is below the longest sequence, {longest} tokens "
            f"(data.max_prompt_tokens {cfg.data.max_prompt_tokens} + rollout.max_new_tokens "
            f"{cfg.rollout.max_new_tokens}): raise it to at least {longest}") in done.stderr


def test_train_refuses_what_plan_refuses_with_the_same_message():
    plan = _pcl("plan", str(PRESET), *TOO_BIG)
    train = _pcl("train", str(PRESET), *TOO_BIG)
    assert plan.returncode == 1 and train.returncode == 2
    shortfall = next(line.strip() for line in plan.stdout.splitlines() if line.strip().startswith("policy learner on"))
    assert "set learner.activation_checkpointing: true" in shortfall
    assert shortfall in train.stderr and "--ignore-plan" in train.stderr


def test_ignore_plan_logs_the_shortfall_and_goes_on(caplog):
    from entrypoints.cli import _check_plan

    cfg = load_config(PRESET, TOO_BIG)
    with pytest.raises(ConfigError, match="set learner.activation_checkpointing: true"):
        _check_plan(cfg, ignore=False)
    with caplog.at_level(logging.WARNING, logger="pcl.train"):
        _check_plan(cfg, ignore=True)
    assert "--ignore-plan: training although pcl plan says" in caplog.text
    _check_plan(load_config(PRESET), ignore=False)  # the preset itself fits
    _check_plan(load_config(REPO / "configs" / "tiny.yaml"), ignore=False)  # a CPU run is not checked
