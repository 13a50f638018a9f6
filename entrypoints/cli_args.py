"""What the `pcl` commands read from their arguments alike (`entrypoints.cli`, `entrypoints.cli_drills`)."""

from __future__ import annotations

import argparse


def config_files(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """CONFIG (where the command has one) plus further YAML files among the arguments (layered in order), and the
    key=value overrides; no file at all means the defaults."""
    first = [args.config] if getattr(args, "config", None) else []
    files = first + [a for a in args.overrides if "=" not in a and a.endswith((".yaml", ".yml"))]
    return files, [a for a in args.overrides if a not in files]
