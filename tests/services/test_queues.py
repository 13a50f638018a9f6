"""WorkQueue against a real Redis server: delivery, reclaim, dead letters, backpressure, trimming; and
the StepCollector's exactly-once bookkeeping."""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from pcl.engines import RolloutRequest, SamplingParams
from services.streams.payloads import (RequestRecord, RewardNote, RewardRecord, RolloutResult, encode_entry,
                                      pack_logprobs, pack_tokens)
from services.streams.collector import StepCollector
from services.streams.queues import QueueUnavailable, WorkQueue
from services.redis_server import start_embedded


def request(prompt_id: str, step: int = 1, version: int = 1) -> RequestRecord:
    return RequestRecord.of("tiny", step, version, RolloutRequest(prompt_id, (1, 2, 3), SamplingParams(n=4)))


def reward(prompt_id: str, sample: int, step: int = 1, version: int = 1, run: str = "tiny") -> RewardRecord:
    result = RolloutResult(run, step, prompt_id, sample, version, pack_tokens([1]), pack_tokens([2, 3]), "4", "stop", 0.1)
    return RewardRecord.from_result(result, 1.0, 0.01, False)


@pytest.fixture
def make_queue(both_redis_clients, key_prefix):
    def make(consumer: str = "c1", stream: str = "requests", group: str = "workers", **options) -> WorkQueue:
        return WorkQueue(both_redis_clients, f"{key_prefix}:{stream}", group, consumer, **options)
    return make


@pytest.mark.redis
def test_put_take_ack(make_queue):
    queue = make_queue(block_ms=50)
    records = [request(f"p{i}") for i in range(5)]
    ids = queue.put(records)
    assert len(ids) == 5 and queue.depth() == 5
    taken = queue.take(10)
    assert [d.record for d in taken] == records and [d.id for d in taken] == ids
    assert all(d.deliveries == 1 for d in taken) and queue.in_flight == 5
    assert queue.depth() == 5  # delivered but not acknowledged
    queue.ack(taken[:2])
    assert queue.depth() == 3 and queue.in_flight == 3


@pytest.mark.redis
def test_take_blocks_for_block_ms_then_returns_nothing(make_queue):
    queue = make_queue(block_ms=150)
    start = time.monotonic()
    assert queue.take(10) == []
    assert 0.14 <= time.monotonic() - start < 2.0


@pytest.mark.redis
def test_a_waiting_consumer_takes_a_whole_put_at_once(make_queue, both_redis_clients, key_prefix):
    """A worker blocked in take() wakes to all the entries of one put, not to its first one: a step's 64
    requests are generated as one batch, never as 1 + 63."""
    import threading

    import redis

    pool = both_redis_clients.connection_pool  # the consumer's own connections, named, to see it blocked
    options = {**pool.connection_kwargs, "client_name": f"{key_prefix}:w", "socket_timeout": 180}
    own = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **options))
    producer = make_queue("producer", block_ms=50)
    consumer = WorkQueue(own, f"{key_prefix}:requests", "workers", "worker", block_ms=120_000)
    producer.take(1)  # the group exists before anything is put

    def blocked() -> bool:
        return any(c.get("name") == f"{key_prefix}:w" and c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "")
                   for c in both_redis_clients.client_list())

    try:
        for _ in range(3):
            taken: list = []
            waiting = threading.Thread(target=lambda: taken.extend(consumer.take(64)))
            waiting.start()
            deadline = time.monotonic() + 120
            while not blocked():  # the consumer is blocked in XREADGROUP
                assert waiting.is_alive() and time.monotonic() < deadline, "the consumer never blocked"
                time.sleep(0.01)
            producer.put([request(f"p{i}") for i in range(64)])
            waiting.join(120)
            assert len(taken) == 64, f"the blocked consumer woke to {len(taken)} of the 64 entries"
            consumer.ack(taken)
    finally:
        own.close()


@pytest.mark.redis
def test_consumers_of_one_group_share_the_work(make_queue):
    first, second = make_queue("a", block_ms=20), make_queue("b", block_ms=20)
    first.put([request(f"p{i}") for i in range(10)])
    got_a, got_b = first.take(4), second.take(100)
    ids_a, ids_b = {d.id for d in got_a}, {d.id for d in got_b}
    assert len(ids_a) == 4 and len(ids_b) == 6 and not ids_a & ids_b


@pytest.mark.redis
def test_backpressure_caps_unacked_deliveries(make_queue):
    queue = make_queue(max_in_flight=3, block_ms=20)
    queue.put([request(f"p{i}") for i in range(10)])
    held = queue.take(10)
    assert len(held) == 3
    assert queue.take(10) == []  # full: nothing more until something is acknowledged
    queue.ack(held[:1])
    assert len(queue.take(10)) == 1


@pytest.mark.redis
def test_entries_of_a_silent_consumer_are_reclaimed_after_the_visibility_timeout(make_queue):
    stalled = make_queue("stalled", visibility_timeout_s=0.3, block_ms=20)
    rescuer = make_queue("rescuer", visibility_timeout_s=0.3, block_ms=20)
    patient = make_queue("patient", visibility_timeout_s=600, block_ms=20)  # not stale yet, however slow this is
    stalled.put([request(f"p{i}") for i in range(4)])
    held = stalled.take(10)
    assert patient.take(10) == []  # not stale yet
    time.sleep(0.35)  # past the rescuer's visibility timeout (a slower machine only waits longer)
    rescued = rescuer.take(10)
    assert [d.id for d in rescued] == [d.id for d in held]
    assert all(d.deliveries == 2 for d in rescued)
    rescuer.ack(rescued)
    assert rescuer.depth() == 0


@pytest.mark.redis
def test_a_poison_record_is_retried_then_dead_lettered_without_blocking_the_queue(make_queue):
    queue = make_queue(visibility_timeout_s=0.05, max_deliveries=3, block_ms=20)
    queue.put([request("good0"), request("poison"), request("good1"), request("good2")])
    done, attempts = [], 0
    deadline = time.monotonic() + 10
    while queue.dead_letter_count() == 0 and time.monotonic() < deadline:
        for delivery in queue.take(10):
            if delivery.record.prompt_id == "poison":
                attempts += 1
                queue.fail(delivery, ValueError("cannot parse the answer"))
            else:
                done.append(delivery.record.prompt_id)
                queue.ack([delivery])
    assert sorted(done) == ["good0", "good1", "good2"] and attempts == 3
    assert queue.dead_letter_count() == 1 and queue.depth() == 0
    [letter] = queue.dead_letters()
    assert "cannot parse the answer" in letter["error"] and letter["deliveries"] == "3"
    assert letter["payload"] == queue.client.xrange(queue.stream)[1][1][b"d"]


@pytest.mark.redis
def test_a_record_whose_consumers_keep_dying_is_dead_lettered(make_queue):
    options = dict(visibility_timeout_s=0.05, max_deliveries=2, block_ms=20)
    make_queue("first", **options).put([request("crasher")])
    for consumer in ("first", "second"):  # each takes it and "dies" (never acks)
        assert len(make_queue(consumer, **options).take(1)) == 1
        time.sleep(0.06)
    survivor = make_queue("third", **options)
    assert survivor.take(1) == []  # third delivery would exceed max_deliveries: dead-lettered instead
    assert survivor.dead_letter_count() == 1
    assert survivor.dead_letters()[0]["error"].startswith("abandoned: delivered 2 times")


@pytest.mark.redis
def test_an_undecodable_entry_is_dead_lettered_at_once(make_queue):
    queue = make_queue(block_ms=20)
    queue.client.xadd(queue.stream, {b"d": b"not a record"})
    queue.put([request("fine")])
    assert [d.record.prompt_id for d in queue.take(10)] == ["fine"]
    assert queue.dead_letter_count() == 1 and "undecodable" in queue.dead_letters()[0]["error"]


@pytest.mark.redis
def test_a_request_with_invalid_sampling_is_dead_lettered_at_once(make_queue):
    """A request entry whose sampling breaks SamplingParams' own checks (n=0, top_p=2) does not decode: it is
    dead-lettered like any malformed entry, and the good request beside it is delivered."""
    queue = make_queue(block_ms=20)
    good = encode_entry(request("fine"))
    n_0 = good.replace(b"\xa1n\x04", b"\xa1n\x00")  # the map entry "n": 4 made "n": 0
    top_p_2 = good.replace(b"\xa5top_p\xcb\x3f\xf0", b"\xa5top_p\xcb\x40\x00")  # float64 1.0 made 2.0
    for bad in (n_0, top_p_2):
        assert bad != good
        queue.client.xadd(queue.stream, {b"d": bad})
    queue.put([request("fine")])
    assert [d.record.prompt_id for d in queue.take(10)] == ["fine"]
    errors = [letter["error"] for letter in queue.dead_letters()]
    assert queue.dead_letter_count() == 2 and all(e.startswith("undecodable") for e in errors), errors
    assert sorted(e.split("payload: ")[1].split(":")[0] for e in errors) == ["SamplingParams.n", "SamplingParams.top_p"]


@pytest.mark.redis
def test_a_result_with_a_nan_logprob_is_dead_lettered_at_once_with_its_key(make_queue):
    """A result group one of whose samples carries a NaN engine log-probability is a malformed entry: dead-lettered
    on its first take, the error naming the sample and the letter holding its key; the entry beside it is delivered."""
    queue = make_queue(stream="rollout_results", block_ms=20)
    logprobs = pack_logprobs([-0.25, -1.0])
    samples = [RolloutResult("tiny", 4, "p9", j, 4, pack_tokens([1]), pack_tokens([2, 3]), "4", "stop", 0.1,
                             logprobs=logprobs) for j in range(3)]
    samples[1] = msgspec.structs.replace(samples[1], logprobs=pack_logprobs([-0.25, float("nan")]))
    queue.put([samples, samples[:1]])
    [delivery] = queue.take(10)
    assert [r.sample_index for r in delivery.records] == [0]
    [letter] = queue.dead_letters()
    assert queue.dead_letter_count() == 1 and letter["deliveries"] == "1"
    assert letter["error"].startswith("undecodable: RolloutResult of run 'tiny', step 4, prompt 'p9', sample 1 ")
    assert "log-probability nan at response token 1" in letter["error"]
    assert json.loads(letter["key"]) == ["tiny", 4, "p9", 1, 4]
    [(letter_id, same)] = queue.dead_letters_after("0-0")  # read in order, after a cursor
    assert same == letter and queue.dead_tail_id() == letter_id and queue.dead_letters_after(letter_id) == []


@pytest.mark.redis
def test_forward_writes_downstream_and_acks_together(make_queue):
    requests = make_queue("w", stream="requests", group="rollout", block_ms=20)
    rewards = make_queue("w", stream="rewards", group="coordinator", block_ms=20)
    requests.put([request("p0")])
    [delivery] = requests.take(1)
    requests.forward([delivery], rewards, [reward("p0", j) for j in range(4)])
    assert requests.depth() == 0 and requests.in_flight == 0
    assert [(d.record.prompt_id, d.record.sample_index) for d in rewards.take(10)] == [("p0", j) for j in range(4)]


@pytest.mark.redis
def test_trimming_drops_entries_and_their_pending_entries(make_queue):
    queue = make_queue(block_ms=20)
    ids = queue.put([request(f"p{i}") for i in range(6)])
    held = queue.take(3)  # three pending, three never delivered
    assert queue.trim_before(ids[2]) == 2  # ids below ids[2] go, with their pending entries
    assert [entry_id.decode() for entry_id, _ in queue.client.xrange(queue.stream)] == ids[2:]
    assert queue.client.xpending(queue.stream, queue.group)["pending"] == 1
    assert queue.in_flight == 1 and queue.depth() == 4
    assert queue.trim_committed() == 4
    assert queue.client.xlen(queue.stream) == 0 and queue.depth() == 0 and queue.in_flight == 0
    queue.ack(held)  # acking trimmed entries is harmless
    queue.put([request("next-step")])
    assert [d.record.prompt_id for d in queue.take(10)] == ["next-step"]


@pytest.mark.redis
def test_a_vanished_stream_and_group_are_recreated(make_queue):
    queue = make_queue(block_ms=20)
    queue.client.delete(queue.stream)
    assert queue.take(10) == []  # NOGROUP -> group recreated -> empty read
    queue.put([request("p0")])
    assert len(queue.take(10)) == 1


@pytest.mark.redis
def test_depth_counts_undelivered_entries_on_redis_6(tmp_path):
    with start_embedded(tmp_path, appendonly=False) as handle:  # Redis 6.2 has no consumer-group lag
        queue = WorkQueue(handle.client(), "s", "g", "w", block_ms=20, max_in_flight=5000)
        queue.put([request(f"p{i}") for i in range(2500)])
        queue.take(100)
        assert queue.depth() == 2500
        queue.ack(queue.take(1000))
        assert queue.depth() == 1500


@pytest.mark.redis
def test_unreachable_redis_raises_after_the_reconnect_timeout(tmp_path):
    handle = start_embedded(tmp_path, appendonly=False)
    queue = WorkQueue(handle.client(), "s", "g", "c", reconnect_timeout_s=0.5, block_ms=20)
    handle.close()
    start = time.monotonic()
    with pytest.raises(QueueUnavailable, match="on stream 's': Redis unreachable for 0.5 s"):
        queue.take(1)
    assert time.monotonic() - start < 5


def test_options_are_validated(redis_client):
    with pytest.raises(ValueError, match="max_in_flight"):
        WorkQueue(redis_client, "s", "g", "c", max_in_flight=0)
    with pytest.raises(ValueError, match="socket_timeout"):
        WorkQueue(redis_client, "s", "g", "c", block_ms=60_000)


def test_step_collector_keeps_one_record_per_key_and_counts_drops():
    collector = StepCollector("tiny", step=5, policy_version=5, expected={("a", 0), ("a", 1), ("b", 0)})
    offered = [reward("a", 0, step=5, version=5), reward("a", 0, step=5, version=5),  # duplicate
               reward("a", 1, step=4, version=4),  # straggler of the previous step
               reward("b", 0, step=5, version=4),  # generated with last step's weights
               reward("c", 0, step=5, version=5), reward("a", 1, step=5, version=5, run="other"),  # unexpected
               reward("b", 0, step=5, version=5)]
    assert collector.offer_all(offered[:-1]) == 1
    assert not collector.complete and collector.missing == {("a", 1), ("b", 0)}
    assert collector.offer(offered[-1]) and collector.offer(reward("a", 1, step=5, version=5))
    assert collector.complete and collector.missing == set()
    assert collector.dropped() == {"duplicates": 1, "stale_step": 1, "stale_version": 1, "unexpected": 2,
                                   "unresolved": 0}
    assert collector.stale_by_producer == {"?@?": 2}  # the stale ones, by who made them (these say nobody)
    assert [(r.prompt_id, r.sample_index) for r in collector.batch()] == [("a", 0), ("a", 1), ("b", 0)]


@pytest.mark.redis
def test_a_group_is_one_entry_and_a_failing_group_is_split(make_queue):
    queue = make_queue(visibility_timeout_s=0.05, max_deliveries=2, block_ms=20)
    group = [reward("p0", j) for j in range(3)]
    queue.put([group])
    [delivery] = queue.take(10)
    assert delivery.records == group and queue.depth() == 1
    with pytest.raises(ValueError, match="holds 3 records"):
        delivery.record
    assert not queue.fail(delivery, RuntimeError("sample 1 crashed the verifier"))
    done, deadline = [], time.monotonic() + 10
    while queue.dead_letter_count() == 0 and time.monotonic() < deadline:
        for single in queue.take(10):  # the group comes back as three single-record entries
            if single.record.sample_index == 1:
                queue.fail(single, RuntimeError("still crashing"))
            else:
                done.append(single.record.sample_index)
                queue.ack([single])
    assert sorted(done) == [0, 2] and queue.dead_letter_count() == 1 and queue.depth() == 0


def result(prompt_id: str, sample: int, step: int = 1, version: int = 1) -> RolloutResult:
    return RolloutResult("tiny", step, prompt_id, sample, version, pack_tokens([1]), pack_tokens([2, sample]),
                         f"answer {sample}", "stop", 0.1)


@pytest.mark.redis
def test_fetch_reads_records_back_by_entry_and_position(make_queue):
    results = make_queue(stream="results", block_ms=20)
    group_id, single_id = results.put([[result("a", 0), result("a", 1)], result("b", 0)])
    got = results.fetch([(group_id, 1), (single_id, 0), (group_id, 0), (group_id, 2), ("1-1", 0)])
    assert got[:3] == [result("a", 1), result("b", 0), result("a", 0)]
    assert got[3:] == [None, None]  # no such position; no such entry
    results.trim_committed()
    assert results.fetch([(group_id, 0)]) == [None]


@pytest.mark.redis
def test_collector_joins_kept_notes_with_their_results_and_reads_nothing_for_dropped_ones(make_queue):
    results = make_queue(stream="results", block_ms=20)
    group_id, late_id = results.put([[result("a", 0), result("a", 1)], result("b", 0, step=0, version=0)])
    fetched = []

    def resolve(notes):
        fetched.extend(notes)
        return results.join(notes)

    collector = StepCollector("tiny", 1, 1, {("a", 0), ("a", 1)}, resolve=resolve)
    note_a0 = RewardNote.of(result("a", 0), group_id, 0, 1.0, 0.01, False)
    note_a1 = RewardNote.of(result("a", 1), group_id, 1, 0.0, 0.02, True)
    stale = RewardNote.of(result("b", 0, step=0, version=0), late_id, 0, 1.0, 0.0, False)
    assert collector.offer_all([note_a0, note_a0, stale, note_a1]) == 2
    assert fetched == [note_a0, note_a1]  # the duplicate and the stale note cost no read
    assert collector.complete and collector.batch() == [RewardRecord.from_result(result("a", 0), 1.0, 0.01, False),
                                                        RewardRecord.from_result(result("a", 1), 0.0, 0.02, True)]
    assert collector.dropped()["duplicates"] == 1 and collector.dropped()["stale_step"] == 1


@pytest.mark.redis
def test_a_note_whose_result_is_gone_leaves_the_sample_missing_until_a_good_one_comes(make_queue):
    results = make_queue(stream="results", block_ms=20)
    first = results.put([result("a", 0)])[0]
    results.trim_committed()
    second = results.put([result("a", 0)])[0]
    wrong = RewardNote.of(result("a", 0), second, 0, 1.0, 0.0, False)
    wrong.sample_index = 1  # points at sample 0 while claiming to be sample 1
    collector = StepCollector("tiny", 1, 1, {("a", 0), ("a", 1)}, resolve=results.join)
    gone = RewardNote.of(result("a", 0), first, 0, 1.0, 0.0, False)
    assert collector.offer_all([gone, wrong]) == 0
    assert collector.missing == {("a", 0), ("a", 1)} and collector.dropped()["unresolved"] == 2
    assert collector.offer(RewardNote.of(result("a", 0), second, 0, 1.0, 0.0, False))
    assert collector.missing == {("a", 1)}


def test_a_collector_without_resolve_refuses_notes_and_keeps_nothing_of_them():
    collector = StepCollector("tiny", 1, 1, {("a", 0), ("a", 1)})
    note = RewardNote.of(result("a", 0), "1-0", 0, 1.0, 0.0, False)
    with pytest.raises(TypeError, match="no resolve"):
        collector.offer_all([reward("a", 1), note])
    assert collector.missing == {("a", 0)}
