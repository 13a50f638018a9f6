"""Steady control-plane traffic through a soak, as a dashboard and an operator would send it for days: a status
poll every 2 s, the history's newest records and the event log every 5 s, a /metrics scrape every 5 s, the health
probes every 10 s, and every ACTION_S seconds one operator action in turn: a pause resumed 3 s later, a tau
change (between the config's tau and a little below it), a checkpoint request.

    traffic = SteadyTraffic(lambda: driver.control_url, token, tau=0.5)
    traffic.start(); ...; traffic.stop()
    traffic.summary()     # {"requests": N, "by_status": {"200": ...}, "unexpected": [...the first few]}

Each request expects an answer (200 for a read, 202 for an action; a pause or tau change the run refuses with 409
while it is finishing is expected too); anything else is counted as unexpected, with the first few kept.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Callable

TICK_S = 1.0
ACTION_S = 120.0  # seconds between two operator actions
PAUSE_HELD_S = 3.0
KEPT_UNEXPECTED = 20


class SteadyTraffic:
    def __init__(self, control_url: Callable[[], str | None], token: str, tau: float | None = None):
        self.control_url, self.token, self.tau = control_url, token, tau
        self.by_status: Counter[str] = Counter()
        self.unexpected: list[dict] = []
        self.count = 0
        self.last_step = 0
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="soak-control", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=30)

    def summary(self) -> dict:
        return {"requests": self.count, "by_status": dict(self.by_status), "unexpected": list(self.unexpected)}

    def _loop(self) -> None:
        tick, actions = 0, 0
        while not self.stopped.wait(TICK_S):
            tick += 1
            if tick % 2 == 0:
                status = self.request("GET", "/v1/status")
                if isinstance(status, dict):
                    self.last_step = int(status.get("step") or 0)
            if tick % 5 == 0:
                self.request("GET", f"/v1/history?after={max(-1, self.last_step - 5)}")
                self.request("GET", "/v1/events?limit=20")
            if tick % 5 == 2:
                self.request("GET", "/metrics")
            if tick % 10 == 0:
                self.request("GET", "/livez")
                self.request("GET", "/readyz")
            if tick % int(ACTION_S / TICK_S) == 0:
                self._act(actions % 3, actions // 3)
                actions += 1

    def _act(self, kind: int, n: int) -> None:
        if kind == 0:
            if self.request("POST", "/v1/pause", expect=(202, 409)) is not None and not self.stopped.wait(PAUSE_HELD_S):
                self.request("POST", "/v1/resume", expect=(202, 409))
        elif kind == 1 and self.tau is not None:
            self.request("PATCH", "/v1/params", {"tau": round(self.tau - 0.05 * (n % 2 == 0), 4)}, expect=(202, 409))
        elif kind == 2:
            self.request("POST", "/v1/checkpoint", expect=(202, 409))

    def request(self, method: str, path: str, body: dict | None = None, expect: tuple[int, ...] = ()):
        """One request; its JSON answer (or True for a non-JSON 2xx), None when it failed or was unexpected."""
        url = self.control_url()
        if url is None:
            return None
        expect = expect or ((200,) if method == "GET" else (202,))
        data = None if method == "GET" else json.dumps(body or {}).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        self.count += 1
        status, error, answer = None, None, None
        try:
            with urllib.request.urlopen(urllib.request.Request(url + path, data=data, method=method,
                                                               headers=headers), timeout=30) as reply:
                status, text = reply.status, reply.read()
            answer = json.loads(text) if text[:1] in (b"{", b"[") else True
        except urllib.error.HTTPError as exc:
            status, error = exc.code, exc.read()[:200].decode(errors="replace")
        except (OSError, ValueError) as exc:
            error = repr(exc)[:200]
        self.by_status[str(status)] += 1
        if status not in expect:
            if len(self.unexpected) < KEPT_UNEXPECTED:
                self.unexpected.append({"t": time.time(), "request": f"{method} {path}", "status": status,
                                        "error": error})
            return None
        return answer
