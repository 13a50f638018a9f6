"""What a finished run prints after its summary: where to look next and how to compare, with commands that work
as printed (the run's own config, directory and overrides)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from pcl.config import Config


def comparison_command(run_dir: Path, argv: list[str] | None = None) -> str:
    """The command that runs the same config with uniform selection (GRPO) into a sibling directory: the run's own
    `pcl train` command line with --run-dir replaced and selection.type=uniform added."""
    argv = list(sys.argv if argv is None else argv)
    other = f"{run_dir}-uniform"
    if len(argv) < 3 or argv[1] != "train":
        return f"pcl train CONFIG --run-dir {shlex.quote(other)} selection.type=uniform"
    words, skip = ["pcl", "train"], False
    for word in argv[2:]:
        if skip:
            skip = False
        elif word == "--run-dir":
            skip = True
        elif not (word.startswith("--run-dir=") or word.startswith("--resume") or word.startswith("selection.type=")):
            words.append(word)
    words += ["--run-dir", other, "selection.type=uniform"]
    return shlex.join(words)


def training_plan(cfg: Config) -> str:
    """How long the training will take, in the run's own terms: steps, budgets, evaluations."""
    run = cfg.run
    limits = [f"{run.steps} steps"]
    if run.train_budget_s:
        limits.append(f"{run.train_budget_s:g} s of training (run.train_budget_s)")
    if run.time_budget_s:
        limits.append(f"{run.time_budget_s:g} s in all (run.time_budget_s)")
    text = "training: " + (limits[0] if len(limits) == 1 else ", ".join(limits) + ", whichever comes first")
    if run.eval_every:
        text += f"; held-out accuracy every {run.eval_every} steps" + (" and when the training budget is spent"
                                                                       if run.train_budget_s else "")
    return text


def next_steps(cfg: Config, run_dir: Path, argv: list[str] | None = None) -> str:
    """The lines printed at the end of a run."""
    where = shlex.quote(str(run_dir))
    lines = ["pcl: what next:",
             f"  pcl summary {where}        these figures again (add more run dirs to compare side by side)",
             f"  pcl plot {where}           the curves: held-out accuracy, effective ratio, V's explained variance "
             f"(a PNG)"]
    if cfg.selection.type != "uniform":
        lines.append(f"  {comparison_command(run_dir, argv)}\n"
                     f"      the same run with uniform prompt selection (GRPO), then `pcl summary {where} "
                     f"{shlex.quote(str(run_dir) + '-uniform')}`")
    if cfg.control.enabled:
        lines.append(f"  while a run trains, its dashboard and control plane: http://{cfg.control.host}:"
                     f"{cfg.control.port or 'PORT'}/ (docs/control-plane.md)")
    return "\n".join(lines)
