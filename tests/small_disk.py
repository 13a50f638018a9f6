"""A real small filesystem for disk-full tests: a tmpfs mounted for the duration of a test (needs root, as in
the project's test containers; elsewhere the test is skipped with the reason, and the injected-error tests of
the same code paths still run).

    with tmpfs(tmp_path / "disk", size="512k") as disk:
        ...                                   # writes beyond 512 KiB fail with ENOSPC
        remount(disk, "8m")                   # space freed
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount, which needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                             check=False, capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)
