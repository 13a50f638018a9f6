"""The control plane: a FastAPI app over one run's control state in Redis (docs/architecture.md).

    app = create_app(ControlStore(client, "tiny"), token="...")
    server = ControlServer(app, "127.0.0.1", 8600).start()      # services/control/server.py: uvicorn in a thread

Reads are open; every mutation needs `Authorization: Bearer <token>` (401 without it, compared in constant
time, before the body is read: services/control/guard.py, which also bounds bodies and requests in flight and
adds the security headers). The schema (/openapi.json) is the contract: a request it refuses gets 422
(bodies are read strictly: no boolean, string or null as a number, no fraction as an integer, no field it
does not name), a request valid by it 2xx, or 409 where the run's state refuses it (each route's 409 says
when). Mutations are requests: the coordinator applies them at the next step boundary (services/control/run.py).

While Redis is unreachable (services/control/outage.py) the reads of the run's state (/v1/status, /v1/history,
/v1/events, /metrics) answer from their last good reading, marked stale (a `stale` field, a `PCL-Stale` header,
pcl_control_store_up 0); a read with no reading yet, and a mutation, wait up to redis_wait_s for Redis, then are
refused with 503 and Retry-After: a mutation is either recorded or refused, never half-done. /readyz is 503.

    GET  /v1/status        step, policy version, paused, tau, k, last step's metrics, queue depths, health
    GET  /v1/history       per-step records for plots (?after=STEP&limit=N, N <= HISTORY_PAGE, about 1 MiB a page)
    GET  /v1/fields        the figures a step record declares (name, help, kind, label, title)
    GET  /v1/events        the event log (?after=ID&limit=N)
    POST /v1/pause         pause at the next step boundary          POST /v1/resume
    PATCH /v1/params       {"tau": 0.4, "k": 8}, either or both, from the next step
    POST /v1/checkpoint    202: the request is recorded for the checkpoint writer
    GET  /metrics          Prometheus text (services/control/metrics.py)
    GET  /livez  /readyz   process up; Redis reachable
    GET  /                 the live dashboard (services/control/static/dashboard.html)
    GET  /openapi.json     the OpenAPI schema; GET /docs (Swagger UI, from a CDN) only with control.docs
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Annotated, Any, Callable

import redis
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.middleware.trustedhost import TrustedHostMiddleware

from pcl.config import ControlConfig
from pcl.loop.record import FIGURES
from pcl.credentials import check_token
from services.control.guard import DOCS_CSP, RequestGuard, dashboard_csp
from services.control.metrics import RunCollector, metrics_registry
from services.control.models import Accepted, CheckpointAccepted, Event, HistoryPage, ParamsUpdate, RunStatus
from services.control.outage import REDIS_WAIT_S, RETRY_AFTER_S, Readings, retrying, stale_header
from services.control.requests import ControlRequests
from services.control.state import ControlConflict, ControlValueError

DASHBOARD = Path(__file__).parent / "static" / "dashboard.html"
HISTORY_PAGE = 1000  # step records per /v1/history response at the most; page on with ?after=
HISTORY_PAGE_BYTES = 2**20  # and at most about this much JSON of them (a PCL step's record is 3 to 4 kB)
STREAM_ID = r"^[0-9]{1,19}-[0-9]{1,19}$"  # each part below 2**64 - 1: Redis takes it, also as "(" + id


# -- dependencies --------------------------------------------------------------------------------------------


def get_store(request: Request) -> ControlRequests:
    return request.app.state.store


bearer = HTTPBearer(auto_error=False, description="The run's API token (control.token or PCL_API_TOKEN).")


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), request.app.state.token.encode()):
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


def read_fresh_or_stale(request: Request, response: Response) -> Callable:
    """read(key, fetch) -> (answer, stale): fetch() while Redis answers, else the last good answer (its
    `PCL-Stale` header set on the response)."""
    def read(key, fetch: Callable) -> tuple[Any, dict | None]:
        value, stale = request.app.state.readings.read(key, fetch)
        response.headers.update(stale_header(stale))
        return value, stale

    return read


def write_retried(request: Request) -> Callable:
    """write(fn, *args, **kwargs): fn's Redis write, tried again for up to the app's redis_wait_s while Redis is
    unreachable or full."""
    return lambda fn, *args, **kwargs: retrying(lambda: fn(*args, **kwargs), request.app.state.redis_wait_s)


Store = Annotated[ControlRequests, Depends(get_store)]
Read = Annotated[Callable, Depends(read_fresh_or_stale)]
Write = Annotated[Callable, Depends(write_retried)]


# -- routes --------------------------------------------------------------------------------------------------

UNAVAILABLE = {503: {"description": "Redis unreachable (a read with no reading yet, a mutation not recorded within "
                         "a few seconds), or too many requests in flight; with Retry-After"}}
STALE_HEADER = {"PCL-Stale": {"description": "Only on an answer from the last good reading while Redis is "
                              "unreachable: `age_s=<seconds since it was read>; reason=\"...\"`.",
                              "schema": {"type": "string"}}}
STALE = {200: {"description": "The answer; possibly the last good reading, while Redis is unreachable (PCL-Stale)",
               "headers": STALE_HEADER}}
health = APIRouter(tags=["health"])


@health.get("/livez")
def livez() -> dict:
    return {"live": True}


@health.get("/readyz", responses={503: {"description": "Redis unreachable"}})
def readyz(store: Store) -> JSONResponse:
    try:
        store.client.ping()
    except (redis.RedisError, OSError) as exc:
        return JSONResponse(
            {"ready": False, "reason": f"Redis unreachable: {type(exc).__name__}"}, status_code=503
        )
    return JSONResponse({"ready": True})


reads = APIRouter(prefix="/v1", tags=["run"], responses=UNAVAILABLE)


@reads.get("/status", response_model=RunStatus, responses=STALE)
def status(store: Store, read: Read) -> dict:
    """The run's state; while Redis is unreachable the last good reading, with `stale` set."""
    answer, stale = read("status", store.status)
    return {**answer, "stale": stale}


@reads.get("/history", response_model=HistoryPage, responses=STALE)
def history(
    store: Store,
    read: Read,
    after: Annotated[int, Query(ge=-1)] = -1,
    limit: Annotated[int, Query(ge=1, le=HISTORY_PAGE)] = HISTORY_PAGE,
) -> dict:
    """Per-step records (every figure of the step record, nulls left out) with step > after, oldest first; at
    most `limit` (HISTORY_PAGE) and about HISTORY_PAGE_BYTES of JSON per call; `more` is true while later records
    remain (ask again with after= the last step). While Redis is unreachable, the last good answer to the same
    query, with `stale` set."""
    (records, more), stale = read(("history", after, limit),
                                  lambda: store.history_page(after, limit, HISTORY_PAGE_BYTES))
    return {"records": records, "more": more, "stale": stale}


@reads.get("/fields")
def step_fields() -> dict:
    """The figures a step record declares (`pcl.loop.record.StepRecord`): name, help text, kind (gauge, counter,
    histogram, status), the label of a dict-valued figure, a short title. The dashboard offers each for plotting."""
    return {"fields": [{"name": f.name, "help": f.help, "kind": f.kind, "label": f.label, "title": f.title or f.name}
                       for f in FIGURES.values()]}


@reads.get("/events", response_model=list[Event], responses=STALE)
def events(
    store: Store,
    read: Read,
    after: Annotated[str | None, Query(pattern=STREAM_ID, description="A stream id, MS-SEQ (ASCII digits, at "
                                       "most 19 each: every such id is one Redis takes).")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 200,
) -> list[dict]:
    """The event log, oldest first: the newest `limit` events, or those after the id `after`. While Redis is
    unreachable, the last good answer to the same query (header PCL-Stale)."""
    try:
        return read(("events", after, limit), lambda: store.events(after, limit))[0]
    except redis.ResponseError as exc:  # an id Redis refuses (STREAM_ID keeps them out); not its OOM & co
        if type(exc) is not redis.ResponseError:
            raise
        raise HTTPException(400, f"after: {after!r} is not a stream id Redis accepts ({exc})") from None


control_routes = APIRouter(
    prefix="/v1",
    tags=["control"],
    dependencies=[Depends(require_token)],
    responses={
        401: {"description": "no or wrong bearer token"},
        413: {"description": "a body over control.max_body_bytes (not read)"},
        **UNAVAILABLE,
    },
)


def state_conflict(when: str) -> dict:
    """The 409 of a route: a request valid by the schema that the run's present state refuses."""
    detail = {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}}}
    return {409: {"description": f"Conflicts with the run's state: {when}. The body says which.",
                  "content": {"application/json": {"schema": detail}}}}


FINAL = "the run has finished or failed"


@control_routes.post("/pause", response_model=Accepted, status_code=202,
                     responses=state_conflict(f"already paused or pausing; {FINAL}"))
def pause(store: Store, write: Write) -> dict:
    """Pause at the next step boundary: the step in flight completes, nothing is lost."""
    return {"event": write(store.request_pause)}


@control_routes.post("/resume", response_model=Accepted, status_code=202,
                     responses=state_conflict(f"not paused; {FINAL}"))
def resume(store: Store, write: Write) -> dict:
    return {"event": write(store.request_resume)}


@control_routes.patch("/params", response_model=Accepted, status_code=202, responses={
    400: {"description": "the body is not UTF-8 text (a body that is text but not JSON is 422)"},
    **state_conflict(f"k above the run's k_max (the training set over m; GET /v1/status); the run's "
                     f"selection strategy has no tau or no k to set; {FINAL}")})
def params(update: ParamsUpdate, store: Store, write: Write) -> dict:
    """Set tau and/or k; the next step uses them (recorded as params_applied with that step)."""
    return {"event": write(store.request_params, tau=update.tau, k=update.k)}


@control_routes.post("/checkpoint", response_model=CheckpointAccepted, status_code=202,
                     responses=state_conflict(f"a checkpoint request is still pending; {FINAL}"))
def checkpoint(store: Store, write: Write) -> dict:
    """Record a checkpoint request (one may be pending at a time); the coordinator's checkpoint writer takes
    it at the next step boundary and records checkpoint_written."""
    request = write(store.request_checkpoint)
    return {"request_id": request["id"], "requested_at": request["requested_at"]}


pages = APIRouter()


@pages.get("/metrics", tags=["metrics"], response_class=Response, responses=UNAVAILABLE)
def metrics(request: Request) -> Response:
    """Prometheus text; while Redis is unreachable from the last good reading, with pcl_control_store_up 0."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)


@pages.get("/", include_in_schema=False, response_class=HTMLResponse)
def dashboard(request: Request) -> HTMLResponse:
    return HTMLResponse(request.app.state.dashboard)


def create_app(store: ControlRequests, token: str, control: ControlConfig | None = None,
               redis_wait_s: float = REDIS_WAIT_S) -> FastAPI:
    """The control plane of `store`'s run; mutations need `token`. `control` sets the guard's limits, the
    trusted hosts and /docs (ControlConfig's defaults when None); a mutation waits up to `redis_wait_s` for an
    unreachable or full Redis, a read with no last good reading for an unreachable one."""
    control = control or ControlConfig()
    check_token(token, "the API token")  # ValueError for a short or placeholder token
    app = FastAPI(title="PCL control plane", version="1", summary=f"Steer and watch PCL run {store.run!r}.",
                  docs_url="/docs" if control.docs else None, redoc_url=None)
    app.state.store, app.state.token = store, token
    app.state.readings, app.state.redis_wait_s = Readings(wait_s=redis_wait_s), redis_wait_s
    app.state.registry = metrics_registry(store, app.state.readings)
    _first_readings(app)
    app.state.dashboard = DASHBOARD.read_text(encoding="utf-8")
    for router in (health, reads, control_routes, pages):
        app.include_router(router)
    _add_error_handlers(app)
    if control.allowed_hosts:  # a Host header not listed is 400: a rebound DNS name never reaches a route
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=control.allowed_hosts, www_redirect=False)
    app.add_middleware(RequestGuard, token=token, max_body_bytes=control.max_body_bytes,
                       max_concurrent=control.max_concurrent_requests,
                       csp={"/": dashboard_csp(app.state.dashboard), "/docs": DOCS_CSP})
    return app


def _first_readings(app: FastAPI) -> None:
    """Read the status and the metrics once as the app starts (the driver has just written the run's state): a
    Redis that goes away right after, before anyone asked, still leaves a reading to answer from."""
    try:
        app.state.readings.read("status", app.state.store.status, wait_s=0)
        RunCollector(app.state.store, app.state.readings).reading(wait_s=0)
    except redis.RedisError:  # no Redis now: the first reads wait for it
        pass


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # Where and why, never the input: it may be NaN or a lone surrogate, which JSON cannot carry.
        detail = [{"loc": [_printable(p) for p in e["loc"]], "msg": _printable(e["msg"]), "type": e["type"]}
                  for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(ControlConflict)
    def conflict(_: Request, exc: ControlConflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(ControlValueError)  # a value the run cannot take now (k above k_max): a state rule
    def bad_value(_: Request, exc: ControlValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(redis.RedisError)
    def redis_down(_: Request, exc: redis.RedisError) -> JSONResponse:
        return JSONResponse({"detail": f"Redis unavailable: {type(exc).__name__}"}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})


def _printable(part: Any) -> str | int:
    """A location part or message as valid UTF-8 text (a lone surrogate becomes '?')."""
    return part if isinstance(part, int) else str(part).encode("utf-8", "replace").decode("utf-8")
