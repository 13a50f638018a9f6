"""The control plane held to its own schema: requests generated from the served `/openapi.json` (schemathesis,
positive and negative cases) against a real uvicorn over a real Redis. A body valid by the schema (JSON Schema
2020-12, OpenAPI 3.1's) gets 2xx, or 409 where the operation documents a conflict with the run's state; an
invalid one gets 4xx; nothing gets 5xx, and every status is one the operation documents."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import jsonschema
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core import NOT_SET

from services.control.api import create_app
from services.control.server import ControlServer
from services.control.store import ControlStore
from services.redis_server import make_client
from tests.services.control_fixtures import AUTH, TOKEN, api, running, server, store  # noqa: F401 - fixtures

pytestmark = pytest.mark.redis

SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))


def resolve(node: Any, spec: dict) -> Any:
    """`node` with every local $ref of the spec replaced by what it points to."""
    if isinstance(node, dict):
        if "$ref" in node:
            target = spec
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            return resolve(target, spec)
        return {key: resolve(value, spec) for key, value in node.items()}
    if isinstance(node, list):
        return [resolve(value, spec) for value in node]
    return node


@pytest.fixture
def spec(api) -> dict:
    return api.get("/openapi.json").json()


@pytest.fixture
def session():
    with requests.Session() as s:
        yield s


def params_op(spec: dict) -> dict:
    return spec["paths"]["/v1/params"]["patch"]


def body_validator(op: dict, spec: dict) -> jsonschema.Draft202012Validator:
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator(resolve(schema, spec))


def parsed(content: bytes) -> tuple[bool, Any]:
    """(True, value) for a JSON document, (False, None) otherwise (NaN and Infinity are not JSON)."""
    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        return True, json.loads(content.decode("utf-8"), parse_constant=refuse)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError included
        return False, None


def judge(op: dict, status: int, valid: bool | None, tally: Counter) -> None:
    """Hold one response to the operation's schema (valid None: the input's validity is not judged)."""
    assert status < 500, status
    assert str(status) in op["responses"], f"{status} is not documented ({sorted(op['responses'])})"
    if valid:
        assert 200 <= status < 300 or status == 409, status
    elif valid is False:
        assert 400 <= status < 500, status
    tally["valid" if valid else "invalid" if valid is False else "unjudged", status] += 1


def send(session: requests.Session, url: str, case: Any) -> tuple[int, bytes | None]:
    """The generated request, serialized by schemathesis, with the run's token: its status and the body as it
    went over the wire (None: no body)."""
    case.headers = {**(case.headers or {}), **AUTH}
    r = case.call(base_url=url, session=session)
    body = r.request.body
    note(f"{r.request.method} {r.request.url} {dict(r.request.headers)} {body!r}")
    note(f"{r.status_code} {r.content!r}")
    return r.status_code, body.encode() if isinstance(body, str) else body


def cases(operation: Any) -> st.SearchStrategy:
    return (operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
            | operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))


# -- bodies read strictly, and the schema says which are accepted -------------------------------------------


@pytest.mark.parametrize("body, field", [({"k": 1, "tau": False}, "tau"), ({"tau": 0.5, "k": True}, "k"),
                                         ({"tau": "0.5"}, "tau"), ({"k": "4"}, "k"), ({"k": 2.5}, "k"),
                                         ({"k": 2, "tau": None}, "tau"), ({"k": None}, "k")])
def test_params_are_read_strictly(api, running, body, field):
    r = api.patch("/v1/params", json=body, headers=AUTH)
    assert r.status_code == 422, (body, r.text)
    assert any(error["loc"][-1] == field for error in r.json()["detail"]), r.text
    assert api.get("/v1/status").json()["pending_params"] == {}


@pytest.mark.parametrize("body", [{}, {"tau": None}, {"tau": None, "k": 2}, {"tau": 0}, {"tau": 1}, {"k": 3},
                                  {"tau": 0.25, "k": 1}, {"k": 0}, {"tau": 1.0000001}, {"k": 2.0}, {"k": 1e1},
                                  {"m": 1}, {"tau": 0.5, "m": 1}])
def test_the_schema_says_which_params_bodies_are_accepted(api, running, spec, body):
    valid = body_validator(params_op(spec), spec).is_valid(body)
    r = api.patch("/v1/params", json=body, headers=AUTH)
    assert (200 <= r.status_code < 300) == valid, (body, valid, r.status_code, r.text)


def test_a_rule_of_the_run_state_is_a_documented_409(api, running, spec):
    body = {"k": 17}  # valid by the schema; the training set allows k <= k_max = 16 (the run's state)
    assert body_validator(params_op(spec), spec).is_valid(body)
    r = api.patch("/v1/params", json=body, headers=AUTH)
    assert r.status_code == 409 and "k_max=16" in r.json()["detail"], r.text
    assert "k_max" in params_op(spec)["responses"]["409"]["description"]
    assert api.get("/v1/status").json()["pending_params"] == {}


def test_every_status_redis_being_down_gives_is_documented(spec):
    dead = ControlStore(make_client("redis://127.0.0.1:1/0", decode_responses=True), "nowhere")
    server = ControlServer(create_app(dead, TOKEN, redis_wait_s=0.2), "127.0.0.1", 0).start()  # requests wait 0.2 s
    try:
        for path, item in spec["paths"].items():
            for method, op in item.items():
                body = {"tau": 0.5} if "requestBody" in op else None
                status = httpx.request(method, server.url + path, json=body, headers=AUTH).status_code
                assert status in (200, 503) and str(status) in op["responses"], (method, path, status)
    finally:
        server.stop()


# -- property-based: requests generated from the schema ----------------------------------------------------


def test_params_bodies_generated_from_the_schema(server, running, spec, session):
    """250 bodies for PATCH /v1/params, each judged by the schema as it went over the wire."""
    op, operation = params_op(spec), schemathesis.openapi.from_dict(spec)["/v1/params"]["PATCH"]
    validator, tally = body_validator(op, spec), Counter()

    @settings(max_examples=250, **SETTINGS)
    @given(case=cases(operation))
    def check(case: Any) -> None:
        status, content = send(session, server.url, case)
        is_json, body = parsed(content) if content is not None else (False, None)
        judge(op, status, is_json and validator.is_valid(body), tally)

    check()
    print(dict(tally))
    assert sum(n for (kind, _), n in tally.items() if kind == "valid") >= 30, tally
    assert tally["valid", 202] and tally["valid", 409] and tally["invalid", 422], tally


def test_every_operation_with_inputs_generated_from_the_schema(server, running, spec, session):
    """150 requests over every operation: positive cases (query values valid by their schemas) get 2xx or a
    documented 409; negative ones (a query value is text, and the server may read more than the schema names,
    such as an unknown parameter) are not judged but never 5xx; every status is documented."""
    schema = schemathesis.openapi.from_dict(spec)
    operations = [(method, path) for path, item in sorted(spec["paths"].items()) for method in sorted(item)]
    tally = Counter()

    @settings(max_examples=150, **SETTINGS)
    @given(index=st.integers(0, len(operations) - 1), data=st.data())
    def check(index: int, data: st.DataObject) -> None:
        method, path = operations[index]
        case = data.draw(cases(schema[path][method.upper()]))
        status, content = send(session, server.url, case)
        op = spec["paths"][path][method]
        if "requestBody" in op:  # judged as in the test above
            is_json, body = parsed(content) if content is not None else (False, None)
            judge(op, status, is_json and body_validator(op, spec).is_valid(body), tally)
        else:
            judge(op, status, True if case.meta.generation.mode.is_positive else None, tally)

    check()
    print(dict(tally))
    assert sum(n for (kind, status), n in tally.items() if kind == "valid" and status < 300) >= 25, tally
