"""The docs name code that exists: every repository path cited in docs/architecture.md, README.md and docs/*.md
(in backticks, or as a relative link) is a file or folder of the repository.

A citation counts as a path when it starts with one of the repository's top-level folders (`pcl/...`,
`services/...`, `bench/...`, ...) or is a file at the top (`Makefile`, `docker-compose.yml`); a test id's
`::name` and a trailing `:line` are dropped; spans with placeholders (`RUN_DIR/...`, `<...>`, `*`, `...`, `{`)
are not paths.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("pcl", "services", "actors", "entrypoints", "bench", "configs", "deploy", "tests", "docs")
TOP_FILES = ("Makefile", "README.md", "docker-compose.yml", "pyproject.toml")
DOCS = [ROOT / "docs" / "architecture.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
NOT_PATHS = {  # spans shaped like repository paths that name something else
    "pcl/effective_ratio": "a tracker key (README, logging)",
    "docs/ICLR2026/reinforcement_learning/prompt_curriculum_learning_for_efficient_llm_post-training.md":
        "a file of another repository (docs/reproduce.md, sources)",
}
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.|RUN_DIR|\bDIR\b|NNN|NAME\b|\s")


def cited_paths(text: str) -> set[str]:
    found = set()
    for span in SPAN.findall(text):
        path = span.split("::")[0].rstrip(".,;:)").split(":")[0]
        if PLACEHOLDER.search(path) or not path:
            continue
        if path in NOT_PATHS:
            continue
        if path in TOP_FILES or (path.split("/")[0] in TOPS and "/" in path):
            found.add(path.rstrip("/"))
    return found


def linked_paths(doc: Path, text: str) -> set[str]:
    out = set()
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        out.add(str((doc.parent / target).resolve().relative_to(ROOT)))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_exists(doc):
    text = doc.read_text()
    missing = sorted(p for p in cited_paths(text) | linked_paths(doc, text) if not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} cites paths that do not exist: {missing}"


def test_the_path_finder_finds_paths():
    text = ("`pcl/loop/step.py` `tests/pcl/test_rl.py::test_x` `RUN_DIR/metrics.jsonl` `pcl train CONFIG` "
            "`bench/step.py:12` `Makefile` `configs/presets/` `pcl/*.py`")
    assert cited_paths(text) == {"pcl/loop/step.py", "tests/pcl/test_rl.py", "bench/step.py", "Makefile",
                                 "configs/presets"}
