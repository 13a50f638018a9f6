"""pcl.progress: plain lines at each tenth where there is no terminal, a tqdm bar where there is one, and the
coordinator's long tasks shown by the driver from RUN_DIR/progress.json (only those still running after a
few seconds)."""

from __future__ import annotations

import io
import time

from pcl.progress import Progress, TaskProgress, read_progress, write_progress


def test_plain_lines_at_each_tenth_and_where_it_stopped():
    out = io.StringIO()
    with Progress(25, "probe-batch", "sample", stream=out, terminal=False) as bar:
        for _ in range(25):
            bar.update()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and lines[0].startswith("pcl: probe-batch: 3/25 samples (12%)")
    assert lines[-1].startswith("pcl: probe-batch: 25/25 samples (100%)")
    out = io.StringIO()
    with Progress(1000, "evaluation", stream=out, terminal=False) as bar:
        bar.set(50)
        bar.set(250)  # two tenths at once: one line
        bar.set(260)
    assert [line.split(", ")[0] for line in out.getvalue().splitlines()] == \
        ["pcl: evaluation: 250/1000 its (25%)", "pcl: evaluation: 260/1000 its (26%)"]


def test_a_terminal_gets_a_bar_and_no_lines(capsys):
    out = io.StringIO()
    with Progress(10, "build", stream=out, terminal=True) as bar:
        bar.update(10)
    assert out.getvalue() == "" and "build" in capsys.readouterr().err


def test_the_drivers_view_of_a_coordinator_task(tmp_path):
    write_progress(tmp_path, "stale", 1, 2, 0.0)
    out = io.StringIO()
    view = TaskProgress(tmp_path, out)
    assert read_progress(tmp_path) is None  # an earlier attempt's file is gone
    view.SHOW_AFTER_S = 0.2
    started = time.time()
    write_progress(tmp_path, "held-out evaluation", 0, 100, started)
    view.poll()  # just started: nothing shown yet
    write_progress(tmp_path, "held-out evaluation", 100, 100, started)
    view.poll()  # a short task: never shown
    assert out.getvalue() == ""
    again = time.time() - 30  # the same task again, long this time (begun 30 s ago)
    write_progress(tmp_path, "held-out evaluation", 10, 100, again)
    view.poll()
    time.sleep(0.25)
    write_progress(tmp_path, "held-out evaluation", 60, 100, again)
    view.poll()
    write_progress(tmp_path, "held-out evaluation", 100, 100, again)
    view.poll()
    view.close()
    lines = out.getvalue().splitlines()
    assert [line.split(", ")[0] for line in lines] == \
        ["pcl: held-out evaluation: 60/100 samples (60%)", "pcl: held-out evaluation: 100/100 samples (100%)"]
    assert lines[0].endswith(", 30s")  # the time since the task began, not since it was first shown
