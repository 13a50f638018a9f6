"""The benchmarks, one family: run from the repository root as `python -m bench.NAME [options] [--json PATH]`.

Each module has `main(argv: list[str] | None = None) -> dict`: it parses `argv` (the command line when None),
prints its report, and returns its figures, which `--json PATH` also writes; a benchmark whose figures carry
`exit_code` exits with it. They take from `entrypoints/` at most the training drivers (`run_training`, and
`run_local` for one process); models, tokenizers, prompt sets (`pcl.data.inputs`) and Ray
(`actors.runtime.start_ray`) come from the library.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]  # the repository: configs/ and the working directory of child runs


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the figures to PATH as JSON")


def write_figures(path: str | None, figures: dict) -> dict:
    """Write `figures` to `path` as JSON when a path is given; returns them."""
    if path:
        Path(path).write_text(json.dumps(figures, indent=2, default=str) + "\n")
    return figures


def run(main: Callable[[list[str] | None], dict]) -> None:
    """A benchmark's `__main__`: run it on the command line, exit with its figures' `exit_code` (0 when none)."""
    sys.exit(int(main(None).get("exit_code", 0)))
