"""Ray's logs in the soak report (pcl/tools/soak_logs.py, through pcl/tools/soak_report.py): judged by rotation, not
by "no higher late than early". Logs that grow steadily under the rotation size with a constant number of files are
bounded; a log more every so often grows; a file past the rotation size or a log with too many backups is over its
bound; a soak that saw no Ray logs at all does not pass."""

from __future__ import annotations

from dataclasses import replace

from pcl.tools.soak_logs import log_census, log_of
from pcl.tools.soak_report import Facts, build_report
from pcl.tools.soak_text import format_report

MB = 1e6
ROTATION = 64 << 20
FACTS = Facts(m=64, n=8, checkpoint_every=200, checkpoint_keep=2, history_cap=50_000, events_cap=10_000,
              bounds={}, ray_rotation_bytes=ROTATION, ray_rotation_backups=2)
RUN = {"ended": "finished"}


def _logs(t: float, mb_per_h: float = 3.0) -> dict[str, int]:
    """23 logs as a local Ray writes them, each grown by `mb_per_h` an hour: a fresh session fills them for hours
    before the first rotation."""
    names = ["gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err", "monitor.log", "monitor.out",
             "log_monitor.log", "dashboard.log", "dashboard_agent.log", "runtime_env_agent.log", "debug_state.txt"]
    names += [f"python-core-worker-{i:040x}_{6300 + i}.log" for i in range(6)]
    names += [f"worker-{i:040x}-01000000-{6300 + i}.{kind}" for i in range(3) for kind in ("out", "err")]
    return {f"logs/{name}": int(0.5 * MB + mb_per_h * MB * t / 3600) for name in names}


def _samples(hours: float = 2.0, every_s: float = 60.0, logs=_logs) -> list[dict]:
    out = []
    for i in range(int(hours * 3600 / every_s) + 1):
        t = i * every_s
        ray = logs(t)
        total = sum(ray.values())
        out.append({"t": t, "step": int(t * 2), "procs": {"driver": [600_000_000, 30, 80]},
                    "ray": {"logs/": total, "session/": total + 200_000, **ray}})
    return out


def test_ray_names_its_rotated_backups_as_python_and_spdlog_do():
    assert log_of("monitor.log.2") == ("monitor.log", 2)  # RotatingFileHandler
    assert log_of("gcs_server.1.out") == ("gcs_server.out", 1)  # spdlog: the C++ processes, workers' .out/.err
    assert log_of("python-core-worker-ab12_6530.2.log") == ("python-core-worker-ab12_6530.log", 2)
    assert log_of("python-core-worker-ab12_6530.log") == ("python-core-worker-ab12_6530.log", 0)
    assert log_of("old/worker-ab12-01000000-6530.out") == ("worker-ab12-01000000-6530.out", 0)  # a dead worker's
    census = log_census({"logs/": 1, "logs/raylet.out": 5, "logs/raylet.1.out": 9, "logs/raylet.2.out": 9,
                         "logs/monitor.log": 3, "logs/monitor.log.1": 4, "session/": 40})
    assert census == (2, 2, 9, "raylet.1.out")


def test_logs_growing_under_rotation_with_a_constant_number_of_files_are_bounded():
    report = build_report(_samples(), FACTS, RUN)
    logs = report["ray"]["logs/"]
    assert logs["end"] > 1.5 * logs["start"]  # the generic rule would call this `grows`
    assert logs["verdict"] == "bounded", logs
    assert logs["logs"] == 23 and logs["bound_bytes"] == 23 * 3 * ROTATION
    assert logs["per_hour"][0] > 60 * MB
    assert report["ray"]["session/"]["verdict"] == "bounded"  # the rest of the session does not climb
    text = format_report(report)
    assert "bounded: 23 logs, each at most 3 x 64 MiB: at most 4.6 GB" in text, text
    assert report["passed"], text


def test_a_log_more_every_few_minutes_grows():
    def restarted(t: float) -> dict[str, int]:  # a worker started again and again: a new log each time
        ray = _logs(t)
        ray.update({f"logs/python-core-worker-{k:040x}_{9000 + k}.log": 300_000 for k in range(int(t // 600))})
        return ray

    report = build_report(_samples(logs=restarted), FACTS, RUN)
    logs = report["ray"]["logs/"]
    assert logs["verdict"] == "grows" and logs["logs_late_max"] > logs["logs_early_max"]
    assert not report["passed"]


def test_a_file_past_the_rotation_size_or_too_many_backups_is_over_bound():
    def unrotated(t: float) -> dict[str, int]:  # rotation not set for it: gcs_server.out grows on
        ray = _logs(t)
        ray["logs/gcs_server.out"] = int(60 * MB + 10 * MB * t / 3600)
        return ray

    report = build_report(_samples(logs=unrotated), FACTS, RUN)
    assert report["ray"]["logs/"]["verdict"] == "over bound"
    assert report["ray"]["logs/gcs_server.out"]["verdict"] == "over bound" and not report["passed"]

    def kept(t: float) -> dict[str, int]:  # more backups kept than RAY_ROTATION_BACKUP_COUNT
        ray = _logs(t)
        ray.update({f"logs/raylet.{i}.out": ROTATION for i in (1, 2, 3)})
        return ray

    report = build_report(_samples(logs=kept), FACTS, RUN)
    assert report["ray"]["logs/"]["verdict"] == "over bound" and not report["passed"]


def test_the_rest_of_the_session_is_judged_without_its_logs():
    samples = _samples()
    for s in samples:  # sockets, runtime resources...: climbing
        s["ray"]["session/"] += int(5 * MB * s["t"] / 3600)
    report = build_report(samples, FACTS, RUN)
    assert report["ray"]["logs/"]["verdict"] == "bounded"
    assert report["ray"]["session/"]["verdict"] == "grows" and not report["passed"]


def test_no_ray_logs_do_not_pass_silently():
    for ray in ({}, {"logs/": 0, "session/": 0}):
        samples = _samples()
        for s in samples:
            s["ray"] = dict(ray)
        report = build_report(samples, FACTS, RUN)
        assert report["ray"]["logs/"]["verdict"] == "missing" and not report["passed"]
        assert "no Ray log files" in format_report(report)


def test_unknown_rotation_settings_are_unresolved():
    report = build_report(_samples(), replace(FACTS, ray_rotation_bytes=None, ray_rotation_backups=None), RUN)
    assert report["ray"]["logs/"]["verdict"] == "unresolved"
