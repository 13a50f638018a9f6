"""The control plane against hostile requests, on a real Redis server and a real uvicorn: bodies refused
unread, inputs JSON cannot carry, ids Redis refuses, too many requests at once, page sizes, Host headers,
security headers and the API docs. The dashboard's handling of hostile run data runs in headless Chromium."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from pcl.config import ControlConfig
from services.control.api import create_app
from services.control.server import ControlServer
from services.control.store import ControlStore
from tests.services.control_fixtures import AUTH, TOKEN, api, running, server, store  # noqa: F401 - fixtures

pytestmark = pytest.mark.redis


def raw_request(port: int, head: bytes, body: bytes = b"", timeout_s: float = 60.0) -> bytes:
    """Send a request's head (and any body) on a fresh connection; the reply's first bytes (b"" on timeout:
    generous, so that only a server that waits for what never comes runs out of it, not a loaded one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(head + body)
        try:
            return sock.recv(65536)
        except TimeoutError:
            return b""


def test_mutations_without_token_or_with_an_oversized_body_are_refused_unread(server, running):
    port = server.port
    head = b"PATCH /v1/params HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    # No body follows the head: a server that waits for it before answering times out here.
    reply = raw_request(port, head % (10 << 20) + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 401 ") and b"www-authenticate: Bearer" in reply, reply[:300]
    authorized = head % (10 << 20) + f"Authorization: Bearer {TOKEN}\r\n".encode() + b"\r\n"
    reply = raw_request(port, authorized)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:300]
    # A chunked body carries no length: it is read up to control.max_body_bytes (64 KiB), then refused.
    chunked = (b"PATCH /v1/params HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n" + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    chunk = b"%x\r\n%s\r\n" % (8192, b" " * 8192)
    reply = raw_request(port, chunked, chunk * 9)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:300]
    assert running.store.desired().tau is None  # nothing was applied


@pytest.mark.parametrize(
    "body",
    [b'{"tau": NaN}', b'{"tau": Infinity}', b'{"tau": -Infinity}', b'{"tau": 1e309}', b'{"k": 1e309}',
     b'{"k": NaN}', b'{"tau": "\\ud800"}', b'{"\\udfff": 1}', b'{"tau": 0.5, "k": "\\ud800\\udc00\\ud800"}'],
)
def test_non_finite_numbers_and_lone_surrogates_are_422(api, running, body):
    r = api.patch("/v1/params", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422, (body, r.status_code, r.text)
    assert r.json()["detail"]  # a JSON body naming the field (never echoing the input)


@pytest.mark.parametrize("query", ["/v1/history?after=NaN", "/v1/history?limit=1e309", "/v1/events?after=%ED%A0%80",
                                   "/v1/events?limit=Infinity", "/v1/history?after=%F0%9F%98%80"])
def test_bad_query_values_are_422(api, running, query):
    r = api.get(query)
    assert r.status_code == 422, (query, r.status_code, r.text)


def test_a_stream_id_redis_would_refuse_is_422_not_503(api, running):
    r = api.get("/v1/events", params={"after": "99999999999999999999-0"})  # the schema allows 19 digits a part
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "after"], r.text
    assert api.get("/v1/events", params={"after": "0-0"}).status_code == 200
    assert api.get("/v1/events", params={"after": "9999999999999999999-9999999999999999999"}).status_code == 200


class HeldStore(ControlStore):
    """A store whose status, once `holding`, is held until `release` is set, counting how many are computed at
    once (the app's own first readings, as it starts, pass)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.lock, self.now, self.most, self.release = threading.Lock(), 0, 0, threading.Event()
        self.holding = False

    def status(self) -> dict:
        if not self.holding:
            return super().status()
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        self.release.wait(120)
        with self.lock:
            self.now -= 1
        return super().status()


def test_requests_beyond_the_concurrency_limit_get_503_at_once(store, running):
    held = HeldStore(store.client, store.run)
    srv = ControlServer(create_app(held, TOKEN, ControlConfig(max_concurrent_requests=4)), "127.0.0.1", 0).start()
    results: list[tuple[int, str | None]] = []
    clients = [httpx.Client(base_url=srv.url, timeout=120) for _ in range(16)]
    for client in clients:  # connected before the burst
        client.get("/livez")

    def get(client: httpx.Client) -> None:
        r = client.get("/v1/status")
        results.append((r.status_code, r.headers.get("retry-after")))

    threads = [threading.Thread(target=get, args=(client,)) for client in clients]
    held.holding = True
    try:
        for t in threads:
            t.start()
        # "At once": the 12 beyond the limit are answered while the 4 admitted are still held.
        deadline = time.monotonic() + 120
        while len(results) < 12 or held.now < 4:
            assert time.monotonic() < deadline, (results, held.now)
            time.sleep(0.02)
        assert held.now == 4 and results == [(503, "1")] * 12, results
        assert httpx.get(f"{srv.url}/livez", timeout=30).status_code == 200  # health checks are exempt
    finally:
        held.release.set()
        for t in threads:
            t.join()
        srv.stop()
    assert held.most == 4 and sorted(results) == [(200, None)] * 4 + [(503, "1")] * 12, results


def test_history_pages_are_capped(api, store, running):
    for step in range(3, 1503):
        store.add_history({"step": step, "train_reward_mean": 0.5})
    first = api.get("/v1/history").json()["records"]
    assert len(first) == 1000 and first[0]["step"] == 0
    rest = api.get("/v1/history", params={"after": first[-1]["step"]}).json()["records"]
    assert [r["step"] for r in first + rest] == list(range(0, 1503))
    assert api.get("/v1/history", params={"limit": 1001}).status_code == 422


def test_trusted_hosts_refuse_other_host_headers(store, running):
    control = ControlConfig(allowed_hosts=["pcl.internal", "127.0.0.1"])
    srv = ControlServer(create_app(store, TOKEN, control), "127.0.0.1", 0).start()
    try:
        assert httpx.get(f"{srv.url}/v1/status").status_code == 200  # Host: 127.0.0.1:PORT
        assert httpx.get(f"{srv.url}/v1/status", headers={"Host": "pcl.internal"}).status_code == 200
        for host in ("attacker.example", "pcl.internal.attacker.example", "localhost"):
            r = httpx.get(f"{srv.url}/v1/status", headers={"Host": host})
            assert r.status_code == 400, host
            r = httpx.post(f"{srv.url}/v1/pause", headers={"Host": host, **AUTH})
            assert r.status_code == 400, host
        assert store.desired().paused is False
    finally:
        srv.stop()


def test_security_headers_on_every_response(api, running):
    for method, path, headers in [("GET", "/", {}), ("GET", "/v1/status", {}), ("GET", "/metrics", {}),
                                  ("GET", "/openapi.json", {}), ("POST", "/v1/pause", {}),
                                  ("GET", "/nowhere", {}), ("POST", "/v1/pause", AUTH)]:
        r = api.request(method, path, headers=headers)
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "no-referrer", path
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, path
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and "http" not in csp, path
    page = api.get("/")
    assert "script-src 'sha256-" in page.headers["content-security-policy"]
    assert api.get("/v1/status").headers["cache-control"] == "no-store"


def test_docs_are_off_by_default_and_on_by_config(api, store, running):
    assert api.get("/docs").status_code == 404 and api.get("/redoc").status_code == 404
    assert "/v1/params" in api.get("/openapi.json").json()["paths"]  # the schema itself is always served
    srv = ControlServer(create_app(store, TOKEN, ControlConfig(docs=True)), "127.0.0.1", 0).start()
    try:
        r = httpx.get(f"{srv.url}/docs")
        assert r.status_code == 200 and "cdn.jsdelivr.net" in r.headers["content-security-policy"]
    finally:
        srv.stop()


def test_short_and_placeholder_tokens_are_refused_by_the_app(store):
    for token in ("short", "replace-me-with-a-long-random-token", "x" * 40):
        with pytest.raises(ValueError, match="API token") as info:
            create_app(store, token)
        assert token not in str(info.value)


HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def test_the_dashboard_shows_hostile_run_data_as_text(store, running):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.services.test_control_live import STEP_S, _chromium

    store.add_event(HOSTILE, "coordinator", step=3, error=HOSTILE)
    store.write_status({**store.published(), "actors": {HOSTILE: HOSTILE}, "run": HOSTILE})
    srv = ControlServer(create_app(store, TOKEN), "127.0.0.1", 0).start()
    browser = _chromium(logging=True)
    try:
        browser.get(f"{srv.url}/")
        # The page's first poll drew the data (data-polls: polls that succeeded), however loaded the machine.
        body = browser.find_element(By.TAG_NAME, "body")
        WebDriverWait(browser, STEP_S).until(lambda _: body.get_attribute("data-polls"))
        assert browser.find_elements(By.CSS_SELECTOR, "#events tr")
        # A control image with the hostile one's address, added after the data was drawn: once its load has
        # failed, an image the data had injected has failed too, and its handler would have run.
        browser.execute_script("const img = new Image();"
                               " img.addEventListener('error', () => { window.__control = 1; });"
                               " img.src = 'x'; document.body.append(img);")
        WebDriverWait(browser, STEP_S).until(lambda b: b.execute_script("return window.__control") == 1)
        assert browser.execute_script("return window.__pwned") is None  # no markup from the data ran
        for table in ("events", "health"):
            element = browser.find_element(By.ID, table)
            assert HOSTILE in element.text, table  # shown, as text
            assert not element.find_elements(By.CSS_SELECTOR, "img, script, b"), table
        assert browser.find_element(By.ID, "run").text == HOSTILE
        points = browser.find_element(By.CSS_SELECTOR, '[data-plot="train_reward_mean"] svg')
        assert points.get_attribute("data-points") == "2"  # the page's own script ran under its policy
        violations = [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
        assert not violations, violations
    finally:
        browser.quit()
        srv.stop()


def test_error_bodies_are_valid_json(api, running):
    r = api.patch("/v1/params", content=b'{"tau": NaN, "k": 1e309}', headers={**AUTH, "Content-Type": "application/json"})
    detail = json.loads(r.text)["detail"]
    assert {tuple(d["loc"]) for d in detail} == {("body", "tau"), ("body", "k")}
    assert all("input" not in d for d in detail)
