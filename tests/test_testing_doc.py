"""docs/testing.md names every test kept out of the default suite, and every test it names exists: a test moved to
`make test-slow` without saying what still covers its ground fails here, and so does a claim about a test that was
renamed or removed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "testing.md"


def _marks_slow(node: ast.AST) -> bool:
    return "mark.slow" in ast.unparse(node)


def slow_tests() -> set[str]:
    """`path::function` of each test marked `slow`, whole or in one of its parameters, read from the test files' syntax
    (the module's `pytestmark`, a test's decorators, a `pytest.param(..., marks=pytest.mark.slow)`)."""
    found = set()
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        whole = any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
                    and _marks_slow(node.value) for node in tree.body)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                if whole or any(_marks_slow(d) for d in node.decorator_list):
                    found.add(f"{path.relative_to(REPO)}::{node.name}")
    return found


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
