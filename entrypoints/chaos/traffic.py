"""Control-plane traffic through a chaos run: status polls every second (with /metrics, the event log, the history
and the health probes among them) and the schedule's actions (a pause and its resume, a tau retune, a checkpoint
request), each request logged with its answer and whether the driver was up.

    traffic = ControlTraffic(run, token)       # run: the ChaosRun (driver state, clock, phase)
    traffic.start(t0, schedule.actions)
    traffic.stop(); traffic.requests           # [{"t", "what", "status" | None, "error", "driver_up", "phase"}]

An action refused while the driver is down is tried again until it is answered: a pause must meet its resume,
or the run would stay paused.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from pcl.tools.chaos_schedule import Action

POLL_S = 1.0
READS = ("/v1/status", "/metrics", "/v1/events?limit=20", "/v1/history?limit=5", "/livez", "/readyz")
ACTIONS = {"pause": ("POST", "/v1/pause", None), "resume": ("POST", "/v1/resume", None),
           "checkpoint": ("POST", "/v1/checkpoint", None), "tau": ("PATCH", "/v1/params", "tau")}


class ControlTraffic:
    def __init__(self, run, token: str):
        self.run, self.token = run, token
        self.requests: list[dict] = []
        self.last_status: dict = {}  # the last /v1/status answered
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
            while self.pending and self.run.clock() >= self.t0 + self.pending[0].at_s:
                if not self._act(self.pending[0]):
                    break  # refused (the driver is down): again at the next turn
                self.pending.pop(0)

    def _act(self, action: Action) -> bool:
        """One scheduled action; True once the control plane answered it (2xx, or a 4xx: e.g. already paused)."""
        method, path, key = ACTIONS[action.what]
        status = self.request(method, path, {key: action.value} if key else None, what=action.what)
        return status is not None and status < 500

    def request(self, method: str, path: str, body: dict | None = None, what: str | None = None) -> int | None:
        """One request to the current driver's control plane, logged; its status, or None when none answered."""
        url = self.run.driver.control_url
        entry = {"t": round(self.run.clock() - self.t0, 2), "what": what or f"{method} {path}",
                 "status": None, "error": None, "driver_up": self.run.control_up(), "phase": self.run.phase()}
        if url is None:
            entry["error"] = "no control plane URL"
        else:
            data = None if body is None and method == "GET" else json.dumps(body or {}).encode()
            headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
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
        entry["driver_up"] = entry["driver_up"] and self.run.control_up()  # up for the whole request
        self.requests.append(entry)
        return entry["status"]
