"""docs/operations.md's "Timeouts on a cluster" and the config schema cannot drift apart: every setting its table
names exists with the default the table gives, and every setting that decides that something is lost (a name
ending in `timeout_s`, `wait_s`, `ttl_s`, `max_restarts`, or one of Ray's health checks) has its row."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from pcl.config import Config

DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
DECIDES_LOSS = re.compile(r"(timeout_s|_wait_s|ttl_s|max_restarts|health_check_\w+)$")


def table() -> dict[str, str]:
    """The section's table: setting -> its default cell, as written."""
    text = DOC.read_text()
    section = text[text.index("## Timeouts on a cluster"):]
    section = section[:section.index("\n## ", 1)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            rows[cells[0].strip("`")] = cells[1].strip("`")
    return rows


def settings(model: BaseModel, prefix: str = "") -> dict[str, object]:
    """Every leaf setting of the config tree (defaults), by dotted key."""
    out = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out.update(settings(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def test_every_setting_in_the_table_exists_with_the_default_it_gives():
    rows, defaults = table(), settings(Config())
    assert len(rows) >= 10, rows  # the table was read
    for key, cell in rows.items():
        assert key in defaults, f"docs/operations.md names {key!r}, which is no setting of the run config"
        default = defaults[key]
        if cell == "null":
            assert default is None, (key, default)
        else:
            assert default is not None and float(cell) == float(default), (
                f"{key}: the table says {cell}, the schema {default}")


def test_every_setting_that_decides_something_is_lost_has_its_row():
    rows = table()
    deciding = sorted(key for key in settings(Config()) if DECIDES_LOSS.search(key))
    assert "redis.visibility_timeout_s" in deciding and "ray.health_check_failure_threshold" in deciding
    missing = [key for key in deciding if key not in rows]
    assert not missing, f"settings that decide something is lost, not in docs/operations.md's table: {missing}"
