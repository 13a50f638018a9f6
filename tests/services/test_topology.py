"""The stream topology declared in services/streams/topology.py: the declaration itself, the queues opened from it,
the source (no queue of a run opened any other way) and the table of docs/queues.md.

That the running fleet uses exactly the declared streams, groups and consumer roles is checked end to end in
tests/actors/test_stream_topology.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pcl.config import RedisConfig
from services.streams.queues import DEAD_LETTER_MAX_BYTES
from services.streams.topology import (
    ROLES, STREAM_GROUPS, STREAMS, TOPOLOGY, Stream, open_queue, open_role, stream_key, streams_of, topology_table,
)

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("pcl", "services", "actors", "entrypoints", "bench")


def test_the_declaration_is_one_chain_from_the_coordinator_back_to_it():
    assert [s.name for s in STREAMS] == ["rollout_requests", "rollout_results", "rewards"]
    assert len(TOPOLOGY) == len(STREAMS) and len(set(STREAM_GROUPS.values())) == len(STREAMS)  # a group per stream
    for stream in STREAMS:
        assert {stream.producer, stream.consumer, *stream.readers} <= set(ROLES), stream
        assert stream.producer != stream.consumer, stream
    # Work leaves the coordinator, each consumer writes the next stream, and the last one comes back to it.
    hops = [(s.producer, s.consumer) for s in STREAMS]
    assert hops == [("coordinator", "rollout"), ("rollout", "verifier"), ("verifier", "coordinator")]
    assert all(a[1] == b[0] for a, b in zip(hops, hops[1:]))
    assert {role for s in STREAMS for role in s.roles()} == set(ROLES)  # no role declared that touches nothing


def test_each_role_opens_the_streams_it_writes_takes_or_reads_back():
    assert [s.name for s in streams_of("coordinator")] == ["rollout_requests", "rollout_results", "rewards"]
    assert [s.name for s in streams_of("rollout")] == ["rollout_requests", "rollout_results"]
    assert [s.name for s in streams_of("verifier")] == ["rollout_results", "rewards"]
    with pytest.raises(ValueError, match="unknown role 'learner'; roles are"):
        streams_of("learner")


def test_unknown_streams_are_refused_by_name():
    assert stream_key("tiny", "rewards") == "pcl:tiny:rewards"
    with pytest.raises(ValueError, match=r"unknown stream 'results'; streams are \['rewards', 'rollout_requests'"):
        stream_key("tiny", "results")


@pytest.mark.redis
def test_open_queue_takes_its_settings_from_the_config_and_the_declaration(redis_client, key_prefix):
    cfg = RedisConfig(visibility_timeout_s=2.5, max_deliveries=5, block_ms=75)
    queue = open_queue(redis_client, key_prefix, "rewards", "coordinator", cfg, max_in_flight=7)
    assert (queue.stream, queue.group) == (f"pcl:{key_prefix}:rewards", "coordinator")
    assert (queue.visibility_ms, queue.max_deliveries, queue.block_ms, queue.max_in_flight) == (2500, 5, 75, 7)
    declared = open_queue(redis_client, key_prefix, "rewards", "coordinator", cfg)
    assert declared.max_in_flight == TOPOLOGY["rewards"].max_in_flight == 1 << 20
    assert (declared.dead_letter_maxlen, declared.dead_letter_max_bytes) == (10_000, DEAD_LETTER_MAX_BYTES)
    assert open_queue(redis_client, key_prefix, "rewards", "c", cfg, block_ms=20).block_ms == 20  # a test's own
    with pytest.raises(ValueError, match="unknown stream 'requests'"):
        open_queue(redis_client, key_prefix, "requests", "c", cfg)


@pytest.mark.redis
def test_open_role_bounds_only_the_streams_the_role_takes_from(redis_client, key_prefix):
    queues = open_role(redis_client, key_prefix, "rollout", "rollout-0", RedisConfig(), max_in_flight=3)
    assert list(queues) == ["rollout_requests", "rollout_results"]
    requests, results = queues["rollout_requests"], queues["rollout_results"]
    assert (requests.group, requests.consumer, requests.max_in_flight) == ("rollout", "rollout-0", 3)
    assert (results.group, results.max_in_flight) == ("verifier", 1024)  # written, not taken: the declared bound
    coordinator = open_role(redis_client, key_prefix, "coordinator", "coordinator")
    assert {name: q.group for name, q in coordinator.items()} == STREAM_GROUPS


def test_a_new_stream_is_one_declaration():
    """What an added stream gets from its declaration alone: a key, a group, the roles that open it."""
    extra = Stream("critiques", "Critique", producer="verifier", group="critic", consumer="coordinator")
    assert extra.roles() == ("verifier", "coordinator")
    assert "| `critiques` | `Critique` | verifier | `critic` | coordinator | - | 1,024 | 10,000 entries, 64 MiB |" \
        in topology_table([*STREAMS, extra])


def test_docs_show_the_declared_topology():
    docs = (ROOT / "docs" / "queues.md").read_text()
    assert topology_table() in docs, "docs/queues.md: paste services.streams.topology.topology_table() into 'Topology'"


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            yield node, func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def test_every_queue_of_a_run_is_opened_from_the_declaration():
    """No product module (nor the tests' pipeline helpers) builds a WorkQueue itself, and every stream named in
    the source is a declared one."""
    files = [p for layer in PRODUCT for p in (ROOT / layer).rglob("*.py")]
    files += [ROOT / "tests" / "services" / "pipeline.py", ROOT / "tests" / "services" / "stream_worker.py"]
    for path in files:
        for call, name in _calls(path):
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            if name == "WorkQueue":
                assert path == ROOT / "services" / "streams" / "topology.py", f"{where}: open the queue with services.streams.topology"
            position = {"open_queue": 2, "stream_key": 1}.get(name)
            stream = call.args[position] if position is not None and len(call.args) > position else None
            if isinstance(stream, ast.Constant):
                assert stream.value in TOPOLOGY, f"{where}: stream {stream.value!r} is not declared"
            if name in ("open_role", "streams_of"):
                role = call.args[2] if name == "open_role" else call.args[0]
                if isinstance(role, ast.Constant):
                    assert role.value in ROLES, f"{where}: role {role.value!r} is not declared"
