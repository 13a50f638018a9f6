"""The per-stream entry counts a run keeps beside its streams (services/streams/counts.py), against a real Redis (the
machine's 7.x and an embedded 6.2): every operation counts what it did, in the same atomic step, and after each
phase of a stream's life (put, forward, a double ack, a dead letter, a commit's trim, a restart's purge) the
counts balance against what Redis holds; entries removed or delivered again behind the counts' back do not."""

from __future__ import annotations

import time

import pytest
import redis

from pcl.tools.chaos_checks import stream_balance
from services.redis_server import start_embedded
from services.streams.counts import CountedStream, inject, read_counts, stream_state
from services.streams.queues import WorkQueue
from tests.services.test_queues import request, reward

pytestmark = pytest.mark.redis


def balanced(queue: WorkQueue) -> dict:
    state = stream_state(queue.client, queue.stream, queue.group)
    assert stream_balance(state) == [], state
    return state


def test_every_entry_is_accounted_for_through_a_streams_life(both_redis_clients, key_prefix):
    options = dict(visibility_timeout_s=0.2, max_deliveries=3, block_ms=20)
    up = WorkQueue(both_redis_clients, f"{key_prefix}:up", "workers", "a", **options)
    rescuer = WorkQueue(both_redis_clients, f"{key_prefix}:up", "workers", "b", **options)
    down = WorkQueue(both_redis_clients, f"{key_prefix}:down", "verifier", "v", **options)
    up.put([request(f"p{i}") for i in range(3)])
    assert balanced(up)["counts"]["put"] == 3 and balanced(up)["unread"] == 3

    taken = up.take(3)
    up.forward(taken[:2], down, [[reward("p0", j) for j in range(4)], reward("p1", 0)])
    assert (read_counts(up.client, up.stream)["acked"], read_counts(down.client, down.stream)["put"]) == (2, 2)
    deadline = time.monotonic() + 30  # the third delivery goes stale, another consumer takes it and acks it
    while not (rescued := rescuer.take(1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [d.id for d in rescued] == [taken[2].id]
    rescuer.ack(rescued)
    up.ack(taken[2:])  # the stalled consumer acks it too: an entry is acknowledged once
    assert balanced(up)["counts"]["acked"] == 3
    up.put([request(f"p{i}") for i in range(3, 6)])

    inject(both_redis_clients, up.stream, b"not a record")  # dead-lettered as undecodable when taken
    [held] = up.take(1)  # p3, held un-acknowledged through the commit below
    state = balanced(up)
    assert state["counts"]["injected"] == 1 and state["counts"]["dead"] == 0 and state["pending"] == 1
    assert state["unread"] == 3  # p4, p5 and the malformed entry

    assert up.trim_committed() == 7  # the step commits; un-acknowledged: p3 (pending), p4, p5, the malformed one
    state = balanced(up)
    assert state["length"] == 0 and (state["counts"]["trimmed"], state["counts"]["trimmed_unacked"]) == (7, 4)
    up.ack([held])  # acking a trimmed entry counts nothing
    assert balanced(up)["counts"]["acked"] == 3

    inject(both_redis_clients, up.stream, b"not a record")
    assert up.take(5) == [] and balanced(up)["counts"]["dead"] == 1
    assert len(up.dead_letters()) == up.dead_letter_count() == 1

    assert len(down.take(1)) == 1  # one pending, one never delivered when the restart purges the streams
    assert CountedStream(down.client, down.stream, down.group).purge() == 2
    state = stream_state(down.client, down.stream, down.group)
    assert not state["exists"] and stream_balance(state) == []
    assert (state["counts"]["purged"], state["counts"]["purged_unacked"]) == (2, 2)


def test_a_dead_letter_of_an_entry_acknowledged_meanwhile_is_not_written(both_redis_clients, key_prefix):
    queue = WorkQueue(both_redis_clients, f"{key_prefix}:up", "workers", "a", max_deliveries=1, block_ms=20)
    queue.put([request("p0")])
    [delivery] = queue.take(1)
    queue.ack([delivery])  # e.g. its first consumer, thought dead, finished it after all
    assert queue.fail(delivery, ValueError("late")) is False
    assert queue.dead_letter_count() == 0 and queue.dead_letters() == []
    assert balanced(queue)["counts"]["acked"] == 1


def test_what_the_counts_do_not_see_unbalances_them(both_redis_clients, key_prefix):
    queue = WorkQueue(both_redis_clients, f"{key_prefix}:up", "workers", "a", block_ms=20)
    ids = queue.put([request(f"p{i}") for i in range(3)])
    queue.ack(queue.take(3))
    balanced(queue)
    queue.client.xdel(queue.stream, ids[0])  # an entry removed uncounted
    state = stream_state(queue.client, queue.stream, queue.group)
    assert any("1 unaccounted for" in p for p in stream_balance(state)), stream_balance(state)

    other = WorkQueue(both_redis_clients, f"{key_prefix}:other", "workers", "a", block_ms=20)
    other.put([request(f"p{i}") for i in range(2)])
    other.ack(other.take(2))
    other.client.xgroup_destroy(other.stream, other.group)  # the group forgotten: every entry delivered again
    other.client.xgroup_create(other.stream, other.group, id="0")
    other.ack(other.take(2))
    state = stream_state(other.client, other.stream, other.group)
    assert any("2 entries added, 4 accounted for" in p for p in stream_balance(state)), stream_balance(state)


def fill(client: redis.Redis) -> None:
    """Redis made full for real (tests/services/test_redis_full.py's way): writes are refused from now on."""
    client.mset({f"filler:{i}": b"f" * 10_000 for i in range(300)})
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 500_000)
    with pytest.raises(redis.OutOfMemoryError):
        client.set("probe", b"x")


def test_a_full_redis_refuses_a_counted_write_whole_and_still_takes_acks(tmp_path):
    with start_embedded(tmp_path / "redis", appendonly=False) as handle:
        client = handle.client()
        up = WorkQueue(client, "pcl:t:up", "workers", "a", block_ms=20)
        down = WorkQueue(client, "pcl:t:down", "verifier", "v", block_ms=20)
        up.put([request(f"p{i}") for i in range(3)])
        taken = up.take(3)
        fill(client)
        counted = CountedStream(client, up.stream, up.group)
        for write in (lambda: counted.forward(down.stream, [b"x"], [taken[0].id]),
                      lambda: inject(client, up.stream, b"x"),
                      lambda: counted.dead_letter(up.dead_stream, taken[0].id, {b"payload": b"x"}, 100)):
            with pytest.raises(redis.OutOfMemoryError):
                write()
        assert read_counts(client, up.stream)["acked"] == 0 and client.xlen(down.stream) == 0
        assert not client.exists(up.dead_stream) and balanced(up)["pending"] == 3
        up.ack(taken)  # an ack frees memory, never takes it: allowed while full, and counted
        assert balanced(up)["counts"]["acked"] == 3
