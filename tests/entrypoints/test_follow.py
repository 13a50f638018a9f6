"""The driver's follow loop (`entrypoints.follow.follow`) over a long run: each second it prints the step records the
coordinator appended since its last look, and its work per second must not grow with the run's length. A run of
20,000 steps already in metrics.jsonl, followed for a few polls against a real Ray task: after its first look, the
bytes this process reads (Linux /proc/self/io, rchar) over the next polls stay well under one reading of the file.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from entrypoints.follow import follow

pytestmark = pytest.mark.ray

STEPS = 20_000


def _read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_following_a_long_run_does_not_read_its_metrics_again_each_second(ray_session, tmp_path):
    import ray

    record = {"step": 0, "effective_ratio": 0.5, "train_reward_mean": 0.5, "note": "x" * 1000}
    lines = [json.dumps({**record, "step": s}) + "\n" for s in range(1, STEPS + 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(lines))
    marker = tmp_path / "done"

    @ray.remote(num_cpus=0)
    def coordinator(path: str) -> dict:
        deadline = time.monotonic() + 120
        while not Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"steps": STEPS + 1}

    polls = []  # the bytes this process had read at each poll

    def on_poll() -> None:
        polls.append(_read_bytes())
        if len(polls) == 1:  # one more step committed while the driver follows
            with open(tmp_path / "metrics.jsonl", "a") as f:
                f.write(json.dumps({**record, "step": STEPS + 1}) + "\n")
        if len(polls) == 4:
            marker.write_text("")

    ref = coordinator.remote(str(marker))
    out = io.StringIO()
    size = (tmp_path / "metrics.jsonl").stat().st_size
    result = follow(ref, tmp_path, STEPS + 1, stream=out, seen=STEPS, on_poll=on_poll)
    read = _read_bytes() - polls[0]  # after the first look at what was there: each poll reads what is new
    assert result == {"steps": STEPS + 1} and len(polls) >= 4
    assert f"step {STEPS + 1}" in out.getvalue() and f"step {STEPS}/" not in out.getvalue()
    assert read < size / 2, f"{read:,} bytes read over {len(polls) - 1} polls of a {size:,}-byte metrics file"
