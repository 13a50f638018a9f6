"""Control-plane traffic through a chaos run: status polls every second (with /metrics, the event log, the history
and the health probes among them), the schedule's actions (a pause and its resume, a tau retune, a checkpoint
request), and every REFUSE_EVERY turns a request the control plane must refuse (a wrong token: 401; a body the
schema refuses: 422; a request the run's state refuses: 409). Each request is recorded with what it expected, its
answer, its Unix times and whether the driver was up, in memory and, line by line, in a file (OUT/requests.jsonl):
the `control` check reads that record (entrypoints/chaos/final.py, pcl.tools.chaos_checks.check_control).

    traffic = ControlTraffic(run, token, record_path)   # run: the ChaosRun (driver state, clock, phase)
    traffic.start(t0, schedule.actions)
    traffic.stop(); traffic.requests    # [{"t", "sent", "answered", "what", "expect", "status" | None, "error",
                                        #   "driver_up", "phase"}]

An action refused while the driver is down (or answered 503) is tried again until it is answered: a pause must meet
its resume, or the run would stay paused. A retry after an attempt that got no answer at all accepts 409 too (the
first attempt may have been recorded: "already paused").
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from pcl.tools.chaos_schedule import Action

POLL_S = 1.0
READS = ("/v1/status", "/metrics", "/v1/events?limit=20", "/v1/history?limit=5", "/livez", "/readyz")
ACTIONS = {"pause": ("POST", "/v1/pause", None), "resume": ("POST", "/v1/resume", None),
           "checkpoint": ("POST", "/v1/checkpoint", None), "tau": ("PATCH", "/v1/params", "tau")}
REFUSE_EVERY = 6  # turns between two requests that must be refused
K_TOO_LARGE = 10**9  # above any run's k_max (its training set over m): refused with 409


class ControlTraffic:
    def __init__(self, run, token: str, record_path: Path | None = None):
        self.run, self.token, self.record_path = run, token, record_path
        self.requests: list[dict] = []
        self.last_status: dict = {}  # the last /v1/status answered
        self.paused = False  # a pause of ours may be in effect (sent, its resume not yet answered)
        self.unanswered: set[str] = set()  # actions whose last attempt got no answer at all
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, t0: float, actions: tuple[Action, ...]) -> None:
        self.t0, self.pending = t0, list(actions)
        self.thread = threading.Thread(target=self._loop, name="chaos-control", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=30)

    def _loop(self) -> None:
        turn = 0
        while not self.stopped.wait(POLL_S):
            if self.run.driver.state in ("ending", "exited"):
                continue  # the run has ended: its control plane is closing
            turn += 1
            self.request("GET", READS[0] if turn % 5 else READS[1 + (turn // 5) % (len(READS) - 1)])
            if turn % REFUSE_EVERY == 0:
                self._refused(turn // REFUSE_EVERY)
            while self.pending and self.run.clock() >= self.t0 + self.pending[0].at_s:
                if not self._act(self.pending[0]):
                    break  # refused (the driver is down): again at the next turn
                self.pending.pop(0)

    def _act(self, action: Action) -> bool:
        """One scheduled action; True once the control plane answered it (anything but no answer or a 5xx)."""
        method, path, key = ACTIONS[action.what]
        expect = [202, 409] if action.what in self.unanswered else [202]
        if action.what == "pause":
            self.paused = True
        status = self.request(method, path, {key: action.value} if key else None, what=action.what, expect=expect)
        if status is None:
            self.unanswered.add(action.what)
        elif status < 500:
            self.unanswered.discard(action.what)
            if action.what == "resume":
                self.paused = False
        return status is not None and status < 500

    def _refused(self, n: int) -> None:
        """A request the control plane must refuse, the three kinds in turn."""
        kind = n % 3
        if kind == 0:
            self.request("POST", "/v1/pause", what="pause with a wrong token", expect=[401],
                         token="wrong-" + secrets.token_urlsafe(24))
        elif kind == 1:
            self.request("PATCH", "/v1/params", {"tau": "half"}, what="params with a bad body", expect=[422])
        elif not self.paused:
            self.request("POST", "/v1/resume", what="resume while not paused", expect=[409])
        else:
            self.request("PATCH", "/v1/params", {"k": K_TOO_LARGE}, what="k above k_max", expect=[409])

    def request(self, method: str, path: str, body: dict | None = None, what: str | None = None,
                expect: list[int] | None = None, token: str | None = None) -> int | None:
        """One request to the current driver's control plane, recorded with what it expected (200 for a read
        unless given); its status, or None when none answered."""
        url = self.run.driver.control_url
        entry = {"t": round(self.run.clock() - self.t0, 2), "sent": time.time(), "answered": None,
                 "what": what or f"{method} {path}", "expect": expect or [200], "status": None, "error": None,
                 "driver_up": self.run.control_up(), "phase": self.run.phase()}
        if url is None:
            entry["error"] = "no control plane URL"
        else:
            data = None if body is None and method == "GET" else json.dumps(body or {}).encode()
            headers = {"Authorization": f"Bearer {token or self.token}", "Content-Type": "application/json"}
            try:
                with urllib.request.urlopen(urllib.request.Request(url + path, data=data, method=method,
                                                                   headers=headers), timeout=10) as answer:
                    entry["status"] = answer.status
                    text = answer.read()
                if path == "/v1/status":
                    self.last_status = json.loads(text)
            except urllib.error.HTTPError as exc:
                entry["status"] = exc.code
                entry["error"] = exc.read()[:200].decode(errors="replace")
            except (OSError, urllib.error.URLError) as exc:
                entry["error"] = repr(exc)[:200]
        entry["answered"] = time.time()
        entry["driver_up"] = entry["driver_up"] and self.run.control_up()  # up for the whole request
        self.requests.append(entry)
        if self.record_path is not None:
            with open(self.record_path, "a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")
        return entry["status"]

