"""The chaos run's invariants (`pcl.tools.chaos_checks`) and report (`pcl.tools.chaos_report`) on crafted records:
a clean run passes each check, and each kind of violation is flagged by name."""

from __future__ import annotations

import copy

import pytest

from pcl.tools.chaos_checks import (MALFORMED_MARK, check_accuracy, check_batches, check_control, check_processes,
                                    check_steps, check_streams, check_trackers, check_versions, check_weights)
from pcl.tools.chaos_report import build_report, commit_times, format_report, recover, steps_redone
from pcl.tools.chaos_schedule import draw_schedule

M, N, STEPS = 3, 2, 4


def clean_run() -> tuple[list[dict], list[dict]]:
    """metrics.jsonl and selections.jsonl of a clean 4-step run (with the step-0 evaluation line)."""
    metrics = [{"step": 0, "policy_version": 0, "eval_accuracy": 0.5}]
    selections = []
    for s in range(1, STEPS + 1):
        metrics.append({"step": s, "policy_version": s, "effective_ratio": 0.5, "batch_samples": M * N,
                        "batch_unique_samples": M * N})
        selections.append({"step": s, "ids": [f"p{s}-{i}" for i in range(M)], "samples": [[1, 0]] * M,
                           "versions": [[s - 1, s - 1]] * M})
    return metrics, selections


def test_a_clean_run_passes():
    metrics, selections = clean_run()
    assert check_steps(metrics, selections, STEPS).ok
    assert check_batches(metrics, selections, M, N).ok
    assert check_versions(selections, max_staleness=0).ok
    assert check_trackers({"pcl/effective_ratio": [1, 2, 3, 4], "timing_s/step": [1, 2, 3, 4]}, STEPS).ok


@pytest.mark.parametrize("change, staleness, needle", [
    (lambda s: s[2].update(versions=[[2, 2], [1, 2], [2, 2]]), 0, "step 3: samples generated outside versions 2..2: "
                                                                  "p3-1: 1"),
    (lambda s: s[2].update(versions=[[2, 2], [1, 2], [2, 3]]), 1, "step 3: samples generated outside versions 1..2: "
                                                                  "p3-2: 3"),  # never a version from the future
    (lambda s: s[0].update(versions=[[0, 0], [0, 0]]), 0, "step 1: versions not parallel"),
    (lambda s: s[1].update(versions=[[1], [1, 1], [1, 1]]), 0, "step 2: versions not parallel"),
    (lambda s: s[3].pop("versions"), 0, "1 selections.jsonl lines record no generating versions"),
])
def test_the_version_check_flags_samples_staler_than_allowed(change, staleness, needle):
    _, selections = clean_run()
    change(selections)
    result = check_versions(selections, max_staleness=staleness)
    assert result.ok is False and needle in result.detail, result.detail


def test_samples_within_max_staleness_pass():
    _, selections = clean_run()
    selections[2]["versions"] = [[1, 2], [2, 2], [1, 1]]  # step 3 trains on versions 1 and 2
    assert check_versions(selections, max_staleness=1).ok and not check_versions(selections, max_staleness=0).ok


def test_the_tracker_check_flags_a_step_written_twice_or_never():
    twice = check_trackers({"pcl/effective_ratio": [1, 2, 3, 3, 4], "timing_s/step": [1, 2, 3, 4]}, STEPS)
    assert twice.ok is False and "pcl/effective_ratio: steps written twice: 3" in twice.detail
    missing = check_trackers({"pcl/effective_ratio": [1, 2, 4]}, STEPS)
    assert missing.ok is False and "steps never written to the tracker: 3" in missing.detail
    assert check_trackers(None, STEPS).ok is None


@pytest.mark.parametrize("change, needle", [
    (lambda m, s: m.insert(3, dict(m[2])), "steps written twice: 2"),  # a metrics line for step 2 twice
    (lambda m, s: m.pop(2), "steps missing: 2"),
    (lambda m, s: m.append({**m[-1], "step": STEPS + 1, "policy_version": STEPS + 1}), "beyond 1..4"),
    (lambda m, s: m.insert(4, m.pop(2)), "went back: 4 -> 2"),  # steps 1, 3, 4, 2
    (lambda m, s: s.pop(), "selections.jsonl: steps missing: 4"),
    (lambda m, s: m[3].update(policy_version=2), "policy version is not the step after it: step 3: 2"),
    (lambda m, s: m.append(dict(m[0])), "evaluation lines written twice"),
])
def test_the_step_check_flags_each_violation(change, needle):
    metrics, selections = clean_run()
    change(metrics, selections)
    result = check_steps(metrics, selections, STEPS)
    assert result.ok is False and needle in result.detail, result.detail


@pytest.mark.parametrize("change, needle", [
    (lambda m, s: m[1].update(batch_samples=M * N - 1), "step 1: batch_samples 5"),
    (lambda m, s: m[2].update(batch_unique_samples=M * N - 1), "unique 5"),
    (lambda m, s: s[0]["ids"].__setitem__(1, s[0]["ids"][0]), "step 1: 3 prompt ids (2 distinct)"),
    (lambda m, s: s[1].update(samples=[[0, 0], [0, 1], [0, 1]]), "step 2: prompts without sample indices"),
    (lambda m, s: s[2].update(samples=[[0, 1], [0, 1]]), "step 3: prompts without sample indices"),
    (lambda m, s: s[3].pop("samples"), "record no sample indices"),
    (lambda m, s: s.pop(1), "steps with a record but no selections.jsonl line: 2"),
    (lambda m, s: m.pop(2), "steps with a selections.jsonl line but no record: 2"),
])
def test_the_batch_check_flags_each_violation(change, needle):
    metrics, selections = clean_run()
    change(metrics, selections)
    result = check_batches(metrics, selections, M, N)
    assert result.ok is False and needle in result.detail, result.detail


def stream(put: int, acked: int, **counts) -> dict:
    """A work stream as the final reading sees it, all trimmed: `put` entries, `acked` of them acknowledged."""
    c = {"put": put, "injected": 0, "acked": acked, "dead": 0, "trimmed": put, "trimmed_unacked": put - acked,
         "purged": 0, "purged_unacked": 0, **counts}
    return {"exists": True, "group": True, "length": 0, "pending": 0, "unread": 0, "counts": c}


def quiet_streams() -> dict:
    """Three streams of a run that restarted once (rollout_results purged with 3 entries, 2 un-acknowledged) and got
    one malformed entry into rewards, dead-lettered."""
    return {"rollout_requests": stream(40, 38),
            "rollout_results": stream(80, 76, trimmed=77, trimmed_unacked=2, purged=3, purged_unacked=2),
            "rewards": stream(300, 300, injected=1, dead=1, trimmed=301)}


INJECTED = [{"stream": "rewards", "payload": b"\x94\x04" + MALFORMED_MARK + b":3:rewards:x", "error": "undecodable"}]


def test_streams_whose_counts_balance_pass():
    result = check_streams(quiet_streams(), INJECTED)
    assert result.ok, result.detail
    assert "rollout_results: 80 put + 0 injected = 76 acked + 0 dead + 2 dropped at commits + 2 at restarts" \
        in result.detail and "1 dead letters, all injected" in result.detail


@pytest.mark.parametrize("change, needle", [
    (lambda s: s["rewards"].update(pending=2, length=2, counts={**s["rewards"]["counts"], "trimmed": 299}),
     "rewards: 2 pending entries"),
    (lambda s: s["rollout_requests"].update(exists=False), "rollout_requests: the stream is missing"),
    (lambda s: s["rollout_results"].update(group=False), "rollout_results: its consumer group is missing"),
    (lambda s: s["rollout_requests"]["counts"].update(put=0, acked=0, trimmed=0, trimmed_unacked=0),
     "rollout_requests: no entry counted as put"),
    (lambda s: s["rollout_requests"]["counts"].update(trimmed=39),  # an entry gone uncounted
     "39 removed by trims and purges, 0 left: +1 unaccounted for"),
    (lambda s: s["rollout_requests"]["counts"].update(acked=39), "40 entries added, 41 accounted for"),
    (lambda s: s["rewards"]["counts"].update(dead=2, acked=299),
     "rewards: 2 entries dead-lettered, 1 dead letters kept"),
    (lambda s: s["rewards"]["counts"].update(dead=0, trimmed_unacked=1), "rewards: 0 entries dead-lettered, 1 dead "
                                                                          "letters kept"),
])
def test_the_stream_check_flags_what_does_not_add_up(change, needle):
    streams = quiet_streams()
    change(streams)
    result = check_streams(streams, INJECTED)
    assert result.ok is False and needle in result.detail, result.detail


def test_a_dead_letter_not_injected_is_flagged():
    streams = quiet_streams()
    streams["rollout_results"]["counts"].update(dead=1, trimmed_unacked=1)
    foreign = INJECTED + [{"stream": "rollout_results", "payload": b"\x94\x04real", "error": "failed 3 times"}]
    result = check_streams(streams, foreign)
    assert result.ok is False and "rollout_results: a dead letter not injected (failed 3 times)" in result.detail


def test_leftover_processes_weights_and_accuracy():
    assert check_processes([], seen=12).ok
    left = check_processes(["4242 ray::RolloutWorker", "4243 redis-server 127.0.0.1:1234"], seen=12)
    assert left.ok is False and "2 processes" in left.detail and "ray::RolloutWorker" in left.detail
    assert check_weights(0.0).ok and check_weights(1e-7).ok
    assert check_weights(3e-4).ok is False and "differ" in check_weights(3e-4).detail
    assert check_weights(None).ok is None and check_weights(None).status == "SKIP"
    assert check_accuracy((0.50, 0.02), (0.52, 0.02)).ok
    assert check_accuracy((0.40, 0.01), (0.52, 0.01)).ok is False
    assert check_accuracy(None, (0.5, 0.1)).ok is None


def req(what: str, status: int | None, at: float, expect=(200,), driver_up: bool = True, took: float = 0.1) -> dict:
    return {"what": what, "expect": list(expect), "status": status, "error": None if status else "refused",
            "driver_up": driver_up, "sent": at, "answered": at + took, "phase": "rollout"}


WINDOWS = [{"type": "driver_start", "start": 0.0, "end": 20.0, "detail": "", "pid": 1},
           {"type": "redis_restart", "start": 100.0, "end": 102.0, "detail": "killed by signal 9", "pid": 1}]


def fine_traffic() -> list[dict]:
    return [req("GET /v1/status", 200, 30.0), req("pause", 202, 31.0, expect=[202]),
            req("pause with a wrong token", 401, 32.0, expect=[401]),
            req("params with a bad body", 422, 33.0, expect=[422]), req("resume while not paused", 409, 34.0, [409]),
            req("GET /v1/status", None, 60.0, driver_up=False), req("pause", 409, 61.0, expect=[202, 409])]


def test_the_control_check_passes_expected_answers_and_503s_inside_the_runs_outage_windows():
    result = check_control(fine_traffic(), WINDOWS)
    assert result.ok and "7 requests: 6 answered as expected (2 2xx; refused: 1 x 401, 2 x 409, 1 x 422)" in \
        result.detail and "1 unanswered while the driver was down" in result.detail, result.detail
    inside = [req("GET /readyz", 503, 101.0), req("tau", 503, 96.0, expect=[202], took=5.0),  # waited 5 s, then 503
              req("GET /v1/status", 503, 102.9)]  # within the 1 s margin
    result = check_control(fine_traffic() + inside, WINDOWS)
    assert result.ok and "3 503 inside the run's outage windows (redis_restart 3)" in result.detail, result.detail
    still_open = WINDOWS + [{"type": "redis_unreachable", "start": 500.0, "end": None, "detail": "", "pid": 2}]
    assert check_control(fine_traffic() + [req("GET /readyz", 503, 900.0)], still_open).ok


@pytest.mark.parametrize("bad, needle", [
    (req("pause", 409, 40.0, expect=[202]), "pause -> 409 (expected 202"),  # a 4xx passes only where expected
    (req("pause with a wrong token", 202, 40.0, expect=[401]), "pause with a wrong token -> 202 (expected 401"),
    (req("params with a bad body", 500, 101.0, expect=[422]), "-> 500 (expected 422"),  # only 503 is excused
    (req("GET /readyz", 503, 150.0), "GET /readyz -> 503 (expected 200"),  # outside every window
    (req("GET /readyz", 503, 103.2), "GET /readyz -> 503"),  # beyond the margin
    (req("GET /v1/status", None, 40.0), "GET /v1/status -> refused (expected 200"),  # the driver was up
])
def test_the_control_check_flags_unexpected_answers(bad, needle):
    result = check_control(fine_traffic() + [bad], WINDOWS)
    assert result.ok is False and needle in result.detail, result.detail


def test_the_control_check_needs_refusals_a_2xx_expectations_and_the_runs_events():
    no_refusals = [r for r in fine_traffic() if r["expect"] != [401] and r["expect"] != [422]
                   and r["what"] != "resume while not paused"]
    assert "no request that must be refused was refused" in check_control(no_refusals, WINDOWS).detail
    only_refusals = [r for r in fine_traffic() if r["status"] and r["status"] // 100 == 4]
    assert "no request was answered 2xx" in check_control(only_refusals, WINDOWS).detail
    unrecorded = check_control(fine_traffic(), None)
    assert unrecorded.ok is False and "the run recorded no events" in unrecorded.detail
    old = [{k: v for k, v in r.items() if k != "expect"} for r in fine_traffic()]
    assert "7 requests recorded without what they expected" in check_control(old, WINDOWS).detail


def test_steps_redone_and_recovery_from_the_timeline():
    timeline = [("commit", 10.0, 1), ("commit", 12.0, 2), ("commit", 14.0, 3), ("restored", 40.0, 2),
                ("commit", 45.0, 3), ("commit", 47.0, 4), ("restored", 80.0, 0), ("commit", 90.0, 1)]
    assert steps_redone(timeline) == 1 + 4
    faults = [{"index": 0, "kind": "kill_learner", "injected_s": 15.0},
              {"index": 1, "kind": "redis_full", "injected_s": 20.0, "ended_s": 46.0},
              {"index": 2, "kind": "malformed", "injected_s": 95.0},
              {"index": 3, "kind": "weight_sync", "injected_s": None}]
    got = recover(faults, commit_times(timeline), finished_at=99.0)
    assert [f["recovered_s"] for f in got] == [30.0, 1.0, 4.0, None]
    assert recover(faults[2:3], commit_times(timeline), finished_at=None)[0]["recovered_s"] is None


def test_the_report_counts_by_kind_and_prints_the_replay_on_failure():
    schedule = draw_schedule(5, 3, 60.0)
    faults = [{"index": f.index, "kind": f.kind, "injected_s": f.at_s, "recovered_s": 2.0 + f.index,
               "phase": "rollout", "note": "x"} for f in schedule.faults]
    metrics, selections = clean_run()
    checks = [check_steps(metrics, selections, STEPS), check_processes([], seen=9)]
    run = {"finished": True, "steps": STEPS, "seconds": 100.0, "restarts": 2, "resumes": 0,
           "started_again": [["coordinator"], ["coordinator", "learner-0", "learner-1"]]}
    passed = build_report(schedule, faults, checks, run, redone=2, replay="pcl chaos c.yaml --seed 5 --faults 3")
    assert passed["passed"] and passed["schedule"] is None
    assert passed["recovery_s"] == {"median": 3.0, "max": 4.0, "recovered": 3, "injected": 3}
    text = format_report(passed, schedule)
    assert "result: PASS" in text and "steps redone after restarts: 2" in text and "replay" not in text
    assert "restarts from a checkpoint: 2; actors started again: coordinator 2, learner 2" in text
    failed = build_report(schedule, faults, checks + [check_processes(["1 ray::Coordinator"], seen=9)], run, 2,
                          "pcl chaos X")
    text = format_report(failed, schedule)
    assert not failed["passed"] and "result: FAIL" in text and "replay with: pcl chaos X" in text
    assert "schedule of seed 5" in text
    missed = build_report(schedule, faults[:2] + [{**faults[2], "injected_s": None, "recovered_s": None}], checks,
                          run, 0, "r")
    assert not missed["passed"] and missed["by_kind"][faults[2]["kind"]]["injected"] == 0


# A run of nothing: each check fed empty records must not pass on its own (another check catching the same run
# is no excuse: each check's PASS is read alone in the report).
@pytest.mark.parametrize("check, needle", [
    (lambda: check_steps([], [], STEPS), "steps missing"),
    (lambda: check_steps([], [], 0), "no step to check"),
    (lambda: check_batches([], [], M, N), "no step records"),
    (lambda: check_batches([{"step": 0, "eval_accuracy": 0.5}], [], M, N), "no step records"),
    (lambda: check_versions([], max_staleness=0), "selections.jsonl holds no line"),
    (lambda: check_trackers({}, STEPS), "steps never written"),
    (lambda: check_streams({}, []), "no work stream"),
    (lambda: check_processes([], seen=0), "no process of the run was seen"),
    (lambda: check_control([], []), "no control-plane request"),
])
def test_a_run_of_nothing_fails_each_check(check, needle):
    result = check()
    assert result.ok is False and needle in result.detail, result.detail


def test_a_run_of_nothing_is_never_a_pass_where_nothing_can_be_compared():
    assert check_trackers(None, STEPS).ok is not True
    assert check_weights(None).ok is not True and check_accuracy(None, None).ok is not True
