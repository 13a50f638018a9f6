"""selections.jsonl records, for each step, the prompts it trained on and the sample indices of each, so that a
run's own records show every (prompt, sample index) trained on exactly once (`pcl chaos` checks it after faults)."""

from __future__ import annotations

from pcl.loop.runlog import read_metrics
from tests.pcl.loop.fakes import FakeFleet, config

PCL = {"type": "pcl", "tau": 0.5, "k": 2}
SPEED = {"type": "speed", "k": 2, "n_init": 2, "carry_over": True}


def test_each_selection_line_holds_the_sample_indices_of_each_prompt(tmp_path):
    fleet = FakeFleet(tmp_path, config(PCL))
    fleet.run.run()
    selections = read_metrics(tmp_path / "selections.jsonl")
    assert [s["step"] for s in selections] == [1, 2, 3]
    for line in selections:
        assert len(line["samples"]) == len(line["ids"]) == 4
        assert all(sorted(indices) == [0, 1, 2, 3] for indices in line["samples"])


def test_a_prompt_continued_over_rounds_lists_every_round_s_indices(tmp_path):
    """SPEED screens with n_init samples, then continues the accepted prompts to n: both rounds' indices count."""
    fleet = FakeFleet(tmp_path, config(SPEED))
    fleet.run.run()
    for line in read_metrics(tmp_path / "selections.jsonl"):
        assert all(sorted(indices) == [0, 1, 2, 3] for indices in line["samples"]), line
