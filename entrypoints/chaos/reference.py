"""The unfaulted reference of a chaos run (`pcl chaos --reference`): the same config and seed, trained straight
through, with the chaos run's tau / k changes applied at the same steps, and the comparison of the two.

    changes = param_changes(chaos_metrics, tau=0.5, k=2)       # [(step, {"tau": 0.41})]: as the records show them
    code = run_reference(command, ref_dir, env, token, changes)
    weights_diff(chaos_dir, ref_dir, steps)                   # max |w - w_ref| of the final policies

A control change takes effect at a step boundary, so the reference replays each one where the chaos run's records
show it took effect: it pauses the reference exactly at that boundary (resuming and pausing again when the pause
landed a step early), sets the value, and resumes. Pauses and checkpoint requests change no weights and are not
replayed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from pcl.loop.runlog import METRICS_FILE, read_metrics, summarize
from pcl.tools.chaos_checks import training_lines


def param_changes(metrics_lines: list[dict], tau: float | None, k: float | None) -> list[tuple[int, dict]]:
    """(first step trained with it, the values that changed) for each change of tau / k in a run's records."""
    out, held = [], {"tau": tau, "k": k}
    for r in training_lines(metrics_lines):
        changed = {key: r[key] for key in held if r.get(key) is not None and r[key] != held[key]}
        if changed:
            held.update(changed)
            out.append((int(r["step"]), {key: (int(v) if key == "k" else v) for key, v in changed.items()}))
    return out


class Replay:
    """The control client that replays changes on the reference run."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: dict | None = None, wait_s: float = 180.0) -> tuple[int, dict]:
        """One request; while nothing listens yet (the driver starting), tried again for up to `wait_s`."""
        data = None if method == "GET" else json.dumps(body or {}).encode()
        deadline = time.monotonic() + wait_s
        while True:
            request = urllib.request.Request(self.url + path, data=data, method=method, headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    return answer.status, json.loads(answer.read() or b"{}")
            except urllib.error.HTTPError as exc:
                return exc.code, {}
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def status(self) -> dict:
        return self.call("GET", "/v1/status")[1]

    def paused_at(self, boundary: int, process: subprocess.Popen, timeout_s: float = 600.0) -> None:
        """Block the run at the boundary after step `boundary` (status step = boundary, state paused)."""
        deadline = time.monotonic() + timeout_s
        asked = False
        while time.monotonic() < deadline and process.poll() is None:
            status = self.status()
            step, state = int(status.get("step") or 0), status.get("state")
            if state == "paused" and step == boundary:
                return
            if step > boundary:
                raise RuntimeError(f"the reference ran past step {boundary} before it paused (at {step})")
            if state == "paused":  # a step early: let one step run, then pause again
                self.call("POST", "/v1/resume")
                asked = False
            elif not asked and step >= boundary - 1 and state in ("running", "waiting"):
                asked = self.call("POST", "/v1/pause")[0] == 202
            time.sleep(0.05)
        raise RuntimeError(f"the reference did not pause after step {boundary}")

    def apply(self, step: int, values: dict, process: subprocess.Popen) -> None:
        """`values` from step `step` on: set while paused at the boundary before it."""
        self.paused_at(step - 1, process)
        code, _ = self.call("PATCH", "/v1/params", values)
        if code != 202:
            raise RuntimeError(f"PATCH /v1/params {values} answered {code}")
        deadline = time.monotonic() + 60
        while self.status().get("pending_params") and time.monotonic() < deadline:
            time.sleep(0.1)  # taken by the paused coordinator (applied to the next step)
        self.call("POST", "/v1/resume")


def run_reference(command: list[str], ref_dir: Path, env: dict[str, str], token: str, port: int,
                  changes: list[tuple[int, dict]], log_path: Path, timeout_s: float) -> tuple[int, str]:
    """Train the reference to the end, replaying `changes`; (exit status, what went wrong or ''). A reference
    still running after `timeout_s` is killed (its whole process group)."""
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen([*command, "--run-dir", str(ref_dir)], stdout=log, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
        note, replay = "", Replay(f"http://127.0.0.1:{port}", token)
        try:
            for step, values in changes:
                replay.apply(step, values, process)
        except (RuntimeError, OSError) as exc:
            note = f"the replay of the control changes failed: {exc}"
            try:  # a pause left behind would hold the reference for good
                replay.call("POST", "/v1/resume", wait_s=5)
            except OSError:
                pass
        try:
            return process.wait(timeout=timeout_s), note
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return -signal.SIGKILL, note or f"the reference did not finish within {timeout_s:.0f} s"


def final_policy(run_dir: Path, steps: int) -> dict:
    import torch

    path = run_dir / "checkpoints" / f"step-{steps:06d}" / "learner.pt"
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def weights_diff(run_dir: Path, ref_dir: Path, steps: int) -> float:
    """max |w - w_ref| over the final policies' tensors (inf when their names differ)."""
    a, b = final_policy(run_dir, steps), final_policy(ref_dir, steps)
    if a.keys() != b.keys():
        return float("inf")
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def final_accuracy(run_dir: Path) -> tuple[float, float | None] | None:
    """The last held-out accuracy of a run and its standard error, or None when it has none."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return None
    summary = summarize(read_metrics(path))
    if summary.get("eval_accuracy_final") is None:
        return None
    return summary["eval_accuracy_final"], summary.get("eval_accuracy_se_final")
