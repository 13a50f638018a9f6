"""The control plane's outer guard: an ASGI middleware that answers before FastAPI reads a request body.

    app.add_middleware(RequestGuard, token=token, max_body_bytes=65536, max_concurrent=64, csp={"/": "..."})

FastAPI reads and parses a JSON body before it runs any dependency, the bearer-token check included, so an
unauthenticated client could make the server buffer a body of any size. This layer runs first, for every HTTP
request, in this order:

1. concurrency: with `max_concurrent` requests already in flight, 503 at once (`Retry-After: 1`); /livez and
   /readyz are exempt, so a loaded control plane is not restarted by its own health checks;
2. mutations (every method but GET, HEAD and OPTIONS): no or a wrong bearer token is 401 (constant-time
   comparison), the body unread;
3. size: a `Content-Length` above `max_body_bytes` is 413, the body unread; a mutation's body is then read
   here, at most `max_body_bytes` (a chunked body that grows past it is 413), and handed on to the app;
4. every response carries the security headers below, and a Content-Security-Policy chosen by path.

A refused request's response says `Connection: close`, so the server drops whatever body the client still
sends instead of parsing it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

READ_METHODS = ("GET", "HEAD", "OPTIONS")
HEALTH_PATHS = ("/livez", "/readyz")
# No script, style, frame, form or plugin from anywhere: JSON and text responses need none.
DEFAULT_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
# The Swagger UI page (/docs, with control.docs) loads its script and style from jsDelivr and starts them with an
# inline script.
DOCS_CSP = ("default-src 'none'; script-src https://cdn.jsdelivr.net 'unsafe-inline'; "
            "style-src https://cdn.jsdelivr.net; img-src https://fastapi.tiangolo.com data:; connect-src 'self'; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=(), payment=(), usb=()"),
)


def dashboard_csp(page: str) -> str:
    """The dashboard's policy: its own inline script and style block only (by hash), requests to this origin."""

    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
                        for b in blocks)

    return (f"{DEFAULT_CSP}; script-src {hashes('script')}; style-src {hashes('style')}; img-src 'self'; "
            f"connect-src 'self'")


class RequestGuard:
    """See the module docstring. `csp` maps a path to its Content-Security-Policy (DEFAULT_CSP elsewhere)."""

    def __init__(self, app: ASGIApp, token: str, max_body_bytes: int, max_concurrent: int,
                 csp: dict[str, str] | None = None):
        self.app, self.token = app, token.encode()
        self.max_body_bytes, self.max_concurrent = max_body_bytes, max_concurrent
        self.csp = {path: policy.encode() for path, policy in (csp or {}).items()}
        self.in_flight = 0  # one event loop serves every request: a plain counter is exact

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = self._with_headers(scope["path"], send)
        if scope["path"] in HEALTH_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_concurrent:
            await _refuse(send, 503, f"more than {self.max_concurrent} requests in flight; retry",
                          (b"retry-after", b"1"))
            return
        self.in_flight += 1
        try:
            await self._guarded(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])  # lower-case names; a repeated header keeps its last value
        mutation = scope["method"] not in READ_METHODS
        if mutation and not self._authorized(headers.get(b"authorization", b"")):
            await _refuse(send, 401, "missing or wrong bearer token", (b"www-authenticate", b"Bearer"))
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await _refuse(send, 413 if length.isdigit() else 400,
                          f"request body over {self.max_body_bytes} bytes" if length.isdigit()
                          else "malformed Content-Length")
            return
        if not mutation:
            await self.app(scope, receive, send)
            return
        body = await self._read_body(receive)
        if body is None:
            await _refuse(send, 413, f"request body over {self.max_body_bytes} bytes")
            return
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, value: bytes) -> bool:
        scheme, _, credentials = value.partition(b" ")
        given = credentials.strip() if scheme.lower() == b"bearer" else b""
        return hmac.compare_digest(given, self.token)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it grows past max_body_bytes."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the app sees an empty body
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _with_headers(self, path: str, send: Send) -> Send:
        csp = self.csp.get(path, DEFAULT_CSP.encode())

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                extra = [*SECURITY_HEADERS, (b"content-security-policy", csp)]
                if path.startswith("/v1/"):
                    extra.append((b"cache-control", b"no-store"))
                headers += [(name, value) for name, value in extra if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        return send_with_headers


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that yields the body already read, then whatever the connection says next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _refuse(send: Send, status: int, detail: str, *extra: tuple[bytes, bytes]) -> None:
    """A JSON error that closes the connection (the client's unread body is dropped, not parsed)."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
