"""`pcl probe-batch` on real parts: an embedded Redis server, local Ray, the HF rollout worker and math-verify
verifier of the tiny config, on an untrained tiny policy (its timing, not its answers, is what is measured)."""

from __future__ import annotations

import re

import pytest

from entrypoints.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.redis]



def test_probe_batch_prints_the_table_and_a_recommendation(untrained_tiny, ray_session, capsys):
    code = main(["probe-batch", "configs/tiny.yaml", "--sizes", "16,32,64,128", "--repeats", "1",
                 f"model.path={untrained_tiny}", "data.tiny_size=256", "data.eval_source=null", "run.n=4",
                 "control.enabled=false"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+4\s+([\d.]+)\s+", out, re.MULTILINE)
    assert [(int(b), int(m)) for b, m, _ in rows] == [(16, 4), (32, 8), (64, 16), (128, 32)]
    assert all(float(s) > 0 for _, _, s in rows)
    recommended = re.search(r"recommended: b = (\d+), \(m, n\) = \((\d+), 4\)", out)
    assert recommended and int(recommended[1]) in (16, 32, 64, 128) and int(recommended[2]) * 4 == int(recommended[1])


def test_probe_batch_rejects_sizes_that_are_not_multiples_of_n(capsys):
    assert main(["probe-batch", "configs/tiny.yaml", "--sizes", "12,32"]) == 2
    assert "multiple of run.n=8" in capsys.readouterr().err
