"""docs/testing.md names every test kept out of the default suite, and every test it names exists: a test moved to
`make test-slow` without saying what still covers its ground fails here, and so does a claim about a test that was
renamed or removed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "testing.md"


def slow_tests() -> set[str]:
    """`path::function` of each test that `pytest -m slow` collects (parameters dropped), from the files that mark any."""
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if "mark.slow" in p.read_text())
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "-p", "no:cacheprovider",
                          *files], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {line.split("[")[0] for line in out.stdout.splitlines() if line.startswith("tests/") and "::" in line}


def test_every_slow_test_is_listed_with_what_covers_it():
    text = DOC.read_text()
    whole_files = set(re.findall(r"`(tests/[\w/]+\.py)` \(every test\)", text))
    missing = sorted(t for t in slow_tests() if f"`{t}`" not in text and t.split("::")[0] not in whole_files)
    assert not missing, f"slow tests docs/testing.md does not list: {missing}"


def test_every_test_the_doc_names_exists():
    text = DOC.read_text()
    named = set(re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?", text))
    assert len(named) > 20
    absent = []
    for path, function in named:
        source = REPO / path
        if not source.is_file() or (function and not re.search(rf"^def {function}\(", source.read_text(), re.M)):
            absent.append(f"{path}::{function}" if function else path)
    assert not absent, f"docs/testing.md names tests that do not exist: {absent}"
