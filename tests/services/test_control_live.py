"""The control plane steering a real tiny run: `pcl train` as its own process (local Ray, embedded Redis, the
HF engine, a 2-rank learner, an untrained tiny policy), paused and resumed step by step so every check is
deterministic. One test drives one run through three phases, in this order (as one test, so that no scheduler
can run them apart or on two runs):

1. /metrics scraped at three step boundaries: step, histogram counts and counters move with the steps;
2. the dashboard in headless Chromium shows the run's data, and its Pause button pauses the run
   (skipped, with the reason, where Chromium or selenium is missing: `make test` installs them);
3. tau and k changed while paused take effect at the next step, recorded with that step; the run finishes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pcl.loop.runlog import read_metrics

# The first test also starts the run (START_S): past the suite's 600 s per test, the deadlines below decide.
pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parents[2]
TOKEN = "live-test-token-0123456789abcdefgh"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STEPS = 5
# Deadlines around event-based waits, for a 2-core machine another test run loads too: the run's start (Ray, the
# fleet, the models; it waits on nothing but the CPU), one step, and the coordinator's answer to a request.
START_S, STEP_S, ANSWER_S = 480, 240, 120



class LiveRun:
    """A `pcl train` process and its control plane."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path, log: Path):
        self.proc, self.run_dir, self.log = proc, run_dir, log
        info = self.wait(lambda: _read_json(run_dir / "control.json"), START_S, "control.json")
        self.url = info["url"]
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def wait(self, predicate, timeout_s: float, what: str):
        deadline, unreachable = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and what != "exit":
                raise AssertionError(
                    f"pcl train exited ({self.proc.returncode}) waiting for {what}:\n{self.tail()}"
                )
            try:
                if value := predicate():
                    return value
            except httpx.TransportError as exc:  # a run that is ending closes its control plane first: its exit
                unreachable = exc                 # and its log say why, on the next turn
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what} (control plane: {unreachable or 'reachable'}):\n"
                             f"{self.tail()}")

    def status(self) -> dict:
        return self.http.get("/v1/status").json()

    def wait_paused_at(self, step: int, timeout_s: float = STEP_S) -> dict:
        return self.wait(
            lambda: (s := self.status())["state"] == "paused" and s["step"] == step and s,
            timeout_s,
            f"paused at step {step}",
        )

    def heartbeat_after(self, when: float) -> bool:
        """Whether the coordinator has beaten its heartbeat since `when` (time.time()): the reply's age is taken
        after this call began, so the beat it implies is, if anything, earlier than the real one."""
        asked = time.time()
        age = self.status()["coordinator"]["heartbeat_age_s"]
        return age is not None and asked - age > when

    def advance_one_step(self) -> dict:
        """Resume, wait until the coordinator has left the boundary, pause again: it pauses after one step."""
        step = self.status()["step"]
        assert self.http.post("/v1/resume", headers=AUTH).status_code == 202
        self.wait(lambda: self.status()["state"] == "running", ANSWER_S, "running")
        assert self.http.post("/v1/pause", headers=AUTH).status_code == 202
        return self.wait_paused_at(step + 1)

    def scrape(self) -> dict[tuple, float]:
        text = self.http.get("/metrics").text
        return {
            (s.name, s.labels.get("le"), s.labels.get("stream")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) if self.log.exists() else ""


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@pytest.fixture
def live(untrained_tiny, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("live") / "run"
    log = run_dir.parent / "train.log"
    model = str(untrained_tiny)
    overrides = [
        f"model.path={model}",
        f"value.path={model}",
        f"run.steps={STEPS}",
        "run.m=8",
        "run.n=4",
        "run.eval_every=2",
        "data.eval_size=16",
        "data.tiny_size=256",
        "selection.k=2",
        "value.ev_sample=4",
        "learner.num_ranks=2",
        "run.time_budget_s=null",
        "control.port=0",
    ]
    env = {**os.environ, "PCL_API_TOKEN": TOKEN}
    env.pop("RAY_ADDRESS", None)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "entrypoints.cli",
                "train",
                "configs/tiny.yaml",
                "--run-dir",
                str(run_dir),
                *overrides,
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    run = None
    try:
        run = LiveRun(proc, run_dir, log)
        # Hold the run before its first step: the tests move it forward one step at a time.
        assert run.http.post("/v1/pause", headers=AUTH).status_code == 202
        run.wait_paused_at(0, START_S)
        yield run
    finally:
        if proc.poll() is None:
            proc.send_signal(2)  # SIGINT: the driver stops its actors, Ray and Redis
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def metrics_change_with_the_steps(live):
    before = live.scrape()
    assert before[("pcl_step", None, None)] == 0 and before[("pcl_paused", None, None)] == 1
    assert before[("pcl_step_seconds_count", None, None)] == 0
    assert ("pcl_queue_depth", None, "rollout_requests") in before
    scrapes = [before]
    for step in (1, 2):
        status = live.advance_one_step()
        assert (
            status["last_step"]["step"] == step
            and status["actors"]
            and set(status["actors"].values()) == {"ok"}
        )
        scrapes.append(live.scrape())
    for previous, now, step in zip(scrapes[:-1], scrapes[1:], (1, 2), strict=True):
        assert now[("pcl_step", None, None)] == step and now[("pcl_policy_version", None, None)] == step
        assert now[("pcl_step_seconds_count", None, None)] == step
        assert now[("pcl_step_seconds_sum", None, None)] > previous[("pcl_step_seconds_sum", None, None)]
        assert now[("pcl_samples_total", None, None)] >= previous[("pcl_samples_total", None, None)] + 8 * 4
        assert (
            now[("pcl_generated_tokens_total", None, None)]
            > previous[("pcl_generated_tokens_total", None, None)]
        )
        assert 0 <= now[("pcl_effective_ratio", None, None)] <= 1 and now[("pcl_tau", None, None)] == 0.5
    assert [r["step"] for r in read_metrics(live.run_dir / "metrics.jsonl")] == [
        0,
        1,
        2,
    ]  # paused: nothing more


def _chromium(logging: bool = False):
    """A headless Chromium driven by selenium, or a skip naming what is missing; with `logging`, the page's
    console (CSP violations included) is kept for browser.get_log("browser")."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip(
            "headless Chromium not installed: apt-get install chromium chromium-driver (make test does)"
        )
    os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium-manager look for drivers on the network
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    if logging:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1500,1000",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


def dashboard_shows_the_run_and_its_pause_button_pauses_it(live, tmp_path):
    """Every wait is on the page's own progress (data-polls, data-drawn-step: a poll every two seconds) or the
    run's, with the file's deadlines for a loaded machine; what the page shows is asserted once it has drawn."""
    from selenium.webdriver.common.by import By

    browser = _chromium()
    try:
        browser.get(f"{live.url}/#token={TOKEN}")

        def page() -> dict:
            """What the page says of its polls, and the points of each plot."""
            body = browser.find_element(By.TAG_NAME, "body")
            seen = {key: body.get_attribute(f"data-{key}") for key in ("polls", "drawn-step", "error")}
            for svg in browser.find_elements(By.CSS_SELECTOR, "[data-plot] svg"):
                plot = svg.find_element(By.XPATH, "..").get_attribute("data-plot")
                seen[plot] = int(svg.get_attribute("data-points") or 0)
            return {**seen, "polls": int(seen["polls"] or 0), "state": browser.find_element(By.ID, "state").text}

        def page_wait(predicate, what: str) -> dict:
            try:
                return live.wait(lambda: p if predicate(p := page()) else None, STEP_S, what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nthe page: {page()}") from None

        # Paused at step 2: once the page has drawn step 2, it has drawn all it will until the run moves.
        drawn = page_wait(lambda p: p["drawn-step"] == "2", "the page to draw step 2")
        assert drawn["train_reward_mean"] == 2 and drawn["eval_accuracy"] == 2, drawn
        assert drawn["seconds"] == 2 and drawn["tau"] == 2 and drawn["state"] == "paused", drawn
        assert TOKEN not in browser.current_url  # the token leaves the address bar

        assert live.http.post("/v1/resume", headers=AUTH).status_code == 202
        live.wait(lambda: live.status()["state"] == "running", ANSWER_S, "running")
        browser.find_element(By.ID, "pause").click()
        status = live.wait_paused_at(3)
        paused_seen, polls = time.time(), page()["polls"]
        # It stays paused: the coordinator beats its heartbeat after the pause, and the page polls twice more
        # (one poll starting after the pause was seen), while the step stays at 3.
        live.wait(lambda: live.heartbeat_after(paused_seen), ANSWER_S, "a heartbeat after the pause")
        held = page_wait(lambda p: p["polls"] >= polls + 2, "two more polls of the page")
        assert live.status()["step"] == 3 == status["step"] and live.status()["state"] == "paused"
        assert held["drawn-step"] == "3" and held["train_reward_mean"] == 3 and held["state"] == "paused", held
        assert held["error"] == "", held
        assert "accepted" in browser.find_element(By.ID, "message").text
        events = live.http.get("/v1/events").json()
        assert [(e["type"], e["step"]) for e in events[-2:]] == [("pause_requested", None), ("paused", 4)]
        shot = os.environ.get("PCL_DASHBOARD_SCREENSHOT") or str(tmp_path / "dashboard.png")
        assert browser.save_screenshot(shot) and Path(shot).stat().st_size > 10_000
    finally:
        browser.quit()


def params_change_at_the_next_step_and_the_run_finishes(live):
    held = live.status()
    assert held["state"] == "paused"
    step = held["step"]
    r = live.http.patch("/v1/params", json={"tau": 0.3, "k": 3}, headers=AUTH)
    assert r.status_code == 202
    assert live.http.patch("/v1/params", json={"tau": 2}, headers=AUTH).status_code == 422
    live.wait(lambda: live.status()["tau"] == 0.3, ANSWER_S, "tau applied to the coordinator's strategy")
    assert live.http.post("/v1/resume", headers=AUTH).status_code == 202
    final = live.wait(lambda: (s := live.status())["state"] == "finished" and s, STEP_S * STEPS, "finished")
    events = live.http.get("/v1/events", params={"limit": 100}).json()
    assert live.wait(lambda: live.proc.poll() is not None, ANSWER_S, "exit") and live.proc.returncode == 0, (
        live.tail()
    )

    assert final["step"] == STEPS and final["pause_requested"] is False
    applied = [e for e in events if e["type"] == "params_applied"]
    assert [(e["step"], e["data"]["tau"], e["data"]["k"]) for e in applied] == [(step + 1, 0.3, 3)]
    paused_at = [e["step"] for e in events if e["type"] == "paused"]
    assert paused_at == list(range(1, step + 2)) and events[-1]["type"] == "finished"  # one per held boundary
    records = [r for r in read_metrics(live.run_dir / "metrics.jsonl") if "step_seconds" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all((r["tau"], r["k"]) == (0.5, 2) for r in records[:step])
    assert all((r["tau"], r["k"]) == (0.3, 3) for r in records[step:])
    assert TOKEN not in live.log.read_text() and TOKEN not in (live.run_dir / "control.json").read_text()


def test_the_control_plane_steers_a_live_run(live, tmp_path):
    """The run paused at step 0; /metrics over steps 1-2, the dashboard and its Pause button at step 3, tau and k
    changed at step 3 and the run finished."""
    metrics_change_with_the_steps(live)
    skipped = None
    try:
        dashboard_shows_the_run_and_its_pause_button_pauses_it(live, tmp_path)
    except pytest.skip.Exception as exc:  # no Chromium here: the rest still runs, then the skip is reported
        skipped = exc
    params_change_at_the_next_step_and_the_run_finishes(live)
    if skipped is not None:
        raise skipped
