"""Queue payloads: round trips, the packed token layout, keys, and clear errors for bad input."""

from __future__ import annotations

import dataclasses
import gc

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcl.engines import RolloutRequest, SamplingParams
from services.streams.payloads import (
    WIRE_VERSION, PayloadError, RecordKey, RequestRecord, RewardNote, RewardRecord, RolloutResult, decode, decode_entry,
    encode, encode_entry, pack_tokens, unpack_tokens,
)


def make_result(tokens=(5, 6, 7), text="the answer is 4", **overrides) -> RolloutResult:
    fields = dict(run="tiny", step=3, prompt_id="row-17", sample_index=2, policy_version=3,
                  prompt_token_ids=pack_tokens([1, 2, 3, 4]), token_ids=pack_tokens(tokens), text=text,
                  finish_reason="stop", generation_seconds=0.25)
    fields.update(overrides)
    return RolloutResult(**fields)


def test_pack_tokens_is_little_endian_uint32():
    assert pack_tokens([1, 256, 2**32 - 1]) == b"\x01\x00\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff"
    assert pack_tokens([]) == b""
    ids = unpack_tokens(pack_tokens(np.array([0, 7, 151_935], dtype=np.int64)))
    assert ids.dtype == np.uint32 and ids.tolist() == [0, 7, 151_935]


@pytest.mark.parametrize("bad", [[-1], [2**32], [[1, 2]], [1.5]])
def test_pack_tokens_rejects_values_outside_uint32(bad):
    with pytest.raises(PayloadError, match="token ids"):
        pack_tokens(bad)


def test_unpack_rejects_a_partial_token():
    with pytest.raises(PayloadError, match="not a multiple of 4"):
        unpack_tokens(b"\x01\x00\x00")


def request_record(sampling: SamplingParams = SamplingParams(n=4), first_index: int = 0) -> RequestRecord:
    return RequestRecord.of("tiny", 4, 4, RolloutRequest("row-9", (3, 1, 4, 1, 5), sampling, first_index))


def test_request_round_trip_with_and_without_seed():
    for sampling in (SamplingParams(n=16), SamplingParams(n=16, temperature=0.6, top_p=0.95, top_k=20,
                                                          max_new_tokens=2048, seed=11)):
        record = request_record(sampling)
        back = decode(encode(record))
        assert back == record and back.sampling == sampling and type(back.sampling) is SamplingParams
        assert back.key == RecordKey("tiny", 4, "row-9", -1, 4) and back.n == 16
        assert back.request() == RolloutRequest("row-9", (3, 1, 4, 1, 5), sampling)  # the engine's request back


def test_request_first_index_round_trips_and_must_not_be_negative():
    record = request_record(SamplingParams(n=12), first_index=4)
    assert decode(encode(record)).first_index == 4 and decode(encode(record)) == record
    assert decode(encode(record)).request().indices == range(4, 16)
    with pytest.raises(PayloadError, match="first_index"):
        RequestRecord("tiny", 4, 4, "row-9", pack_tokens([3]), -1, SamplingParams())


def encoded_request(sampling: dict) -> bytes:
    """A single-record request entry whose sampling is the map `sampling`, whatever its values."""
    return bytes([0x94, WIRE_VERSION, 1, 0]) + msgspec.msgpack.encode(
        ["tiny", 4, 4, "row-9", pack_tokens([3]), 0, sampling])


@pytest.mark.parametrize("field, value", [("n", 0), ("top_p", 2.0), ("temperature", -1.0), ("top_k", -3),
                                          ("max_new_tokens", 0), ("seed", -1)])
def test_a_request_with_invalid_sampling_does_not_decode(field, value):
    """Decoding runs SamplingParams' own checks: a malformed sampling is a PayloadError naming the field (the
    queue dead-letters the entry), never a request that reaches an engine."""
    good = dataclasses.asdict(SamplingParams(n=4))
    assert decode(encoded_request(good)).sampling == SamplingParams(n=4)
    with pytest.raises(PayloadError, match=f"corrupt RequestRecord payload: SamplingParams.{field}"):
        decode(encoded_request({**good, field: value}))
    with pytest.raises(PayloadError, match="corrupt RequestRecord"):
        decode(encoded_request({**good, "n": True}))  # a bool is not a count


def test_result_and_reward_round_trip():
    result = make_result(text="ünïcode ∑ answer \\boxed{4}")
    assert decode(encode(result)) == result
    reward = RewardRecord.from_result(result, reward=1.0, verifier_seconds=0.003, timed_out=False)
    back = decode(encode(reward))
    assert type(back) is RewardRecord and back == reward
    assert back.key == result.key == RecordKey("tiny", 3, "row-17", 2, 3)
    assert unpack_tokens(back.token_ids).tolist() == [5, 6, 7]


def test_reward_note_round_trips_and_joins_only_its_own_result():
    result = make_result(tokens=range(2048), text="x" * 7000)
    note = RewardNote.of(result, "1732000000000-7", 5, reward=1.0, verifier_seconds=0.02, timed_out=False)
    data = encode(note)
    assert decode(data) == note and note.key == result.key
    assert len(data) < 100 < len(encode(result)) // 100  # the note is a hundredth of the sample it stands for
    joined = RewardRecord.from_note(note, result)
    assert joined == RewardRecord.from_result(result, 1.0, 0.02, False)
    other = make_result(sample_index=3)
    with pytest.raises(PayloadError, match="points at entry 1732000000000-7 position 5"):
        RewardRecord.from_note(note, other)
    with pytest.raises(PayloadError, match="position"):
        RewardNote.of(result, "1-0", -1, 0.0, 0.0, False)


def test_token_ids_travel_as_packed_bytes_not_json():
    tokens = np.arange(2048, dtype=np.uint32) * 70 + 1
    result = make_result(tokens=tokens, text="x" * 100)
    data = encode(result)
    assert pack_tokens(tokens) in data  # verbatim, 4 bytes per token
    # MessagePack [4, tag 2, layout 0, record]: 4 header bytes, then the record as an array of its 13 fields:
    # a marker byte, strings and bins with their 1 to 3 length bytes, small integers in 1 byte, a float in 9;
    # the worker's name (empty: 1 byte), no log-probabilities (an empty bin: 2 bytes), the incarnation (empty: 1).
    assert data[:5] == b"\x94\x04\x02\x00\x9d"
    fields = (1 + 4) + 1 + (1 + 6) + 1 + 1 + (2 + 16) + (3 + 4 * 2048) + (2 + 100) + (1 + 4) + 9 + 1 + 2 + 1
    assert len(data) == 4 + 1 + fields


def test_a_note_carries_the_worker_and_incarnation_of_its_sample_and_older_entries_without_them_decode():
    """The producer travels with the sample to its reward note (a stale note is counted by it); an entry of a writer
    before these fields (a result of 12 fields, now 13; a note of 11, now 13) decodes with them empty."""
    result = msgspec.structs.replace(make_result(), worker="rollout-1", incarnation="0123456789ab")
    assert decode(encode(result)).incarnation == "0123456789ab"
    note = decode(encode(RewardNote.of(result, "1-0", 0, 1.0, 0.0, False)))
    assert (note.worker, note.incarnation) == ("rollout-1", "0123456789ab")
    old_result = msgspec.msgpack.encode((4, 2, 0, list(msgspec.structs.astuple(result))[:12]))
    assert decode(old_result) == msgspec.structs.replace(result, incarnation="")
    old_note = msgspec.msgpack.encode((4, 4, 0, list(msgspec.structs.astuple(note))[:11]))
    assert decode(old_note) == msgspec.structs.replace(note, worker="", incarnation="")


def test_records_are_not_tracked_by_the_garbage_collector():
    # A step's batch holds tens of thousands of records; none can be part of a cycle, so none is ever scanned.
    result = make_result()
    note = RewardNote.of(result, "1-0", 0, 1.0, 0.0, False)
    for record in (result, note, RewardRecord.from_note(note, result), decode(encode(result)),
                   request_record(), decode(encode(request_record()))):
        assert not gc.is_tracked(record)


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**32 - 1), max_size=64), text=st.text(max_size=200),
       prompt_id=st.text(min_size=1, max_size=20), reward=st.floats(allow_nan=False),
       step=st.integers(0, 2**62), timed_out=st.booleans())
def test_reward_round_trip_property(tokens, text, prompt_id, reward, step, timed_out):
    reward_record = RewardRecord.from_result(make_result(tokens=tokens, text=text, prompt_id=prompt_id, step=step),
                                             reward=reward, verifier_seconds=1e-4, timed_out=timed_out)
    assert decode(encode(reward_record)) == reward_record


@pytest.mark.parametrize("data, message", [
    (b"", "not a record"),
    (b"\x94\x09\x02\x00rest", "not a record of wire version 4"),  # unknown wire version
    (b"\x94\x03\x01\x00rest", "not a record of wire version 4"),  # version 3: requests had no n in sampling
    (b"\x94\x04\x07\x00rest", "not a record"),  # unknown tag
    (b"\x94\x04\x02\x05rest", "not a record"),  # unknown layout
    (b"\x94\x04\x04\x02rest", "not a record"),  # notes carry no prompt to share
    (b"\x02\x02rest-of-a-version-2-record", "not a record of wire version 4"),
])
def test_decode_rejects_foreign_bytes(data, message):
    with pytest.raises(PayloadError, match=message):
        decode(data)


def test_decode_rejects_truncated_and_corrupt_payloads():
    data = encode(make_result())
    with pytest.raises(PayloadError, match="RolloutResult"):
        decode(data[:-1])
    with pytest.raises(PayloadError, match="RolloutResult"):
        decode(data[:10])
    text_at = data.index(b"the answer")
    with pytest.raises(PayloadError, match="corrupt RolloutResult"):
        decode(data[:text_at] + b"\xff" + data[text_at + 1:])  # invalid UTF-8 in the text


def test_invalid_fields_are_named():
    with pytest.raises(PayloadError, match="token_ids must be packed"):
        make_result(token_ids=[1, 2, 3])
    with pytest.raises(PayloadError, match="token_ids must be packed"):
        make_result(token_ids=bytearray(8))
    with pytest.raises(PayloadError, match="RolloutResult.text must be str, got NoneType"):
        make_result(text=None)
    with pytest.raises(PayloadError, match="RewardNote.result_entry must be str"):
        RewardNote.of(make_result(), b"1-0", 0, 1.0, 0.0, False)
    with pytest.raises(PayloadError, match="RequestRecord.sampling must be SamplingParams"):
        RequestRecord("tiny", 0, 0, "p", b"", 0, {"temperature": 1.0})
    with pytest.raises(PayloadError, match="sample_index"):
        make_result(sample_index=-1)
    with pytest.raises(PayloadError, match="step \\(-1\\)"):
        RequestRecord("tiny", -1, 0, "p", b"", 0, SamplingParams())
    with pytest.raises(ValueError, match="SamplingParams.seed"):
        SamplingParams(seed=-3)
    with pytest.raises(PayloadError, match="cannot encode dict"):
        encode({"run": "tiny"})


def test_group_entries_round_trip_and_single_records_stay_plain():
    results = [make_result(sample_index=j, tokens=[j] * (j + 1)) for j in range(3)]
    assert encode_entry(results[0]) == encode(results[0]) == encode_entry([results[0]])
    data = encode_entry(results)
    assert decode_entry(data) == results and decode_entry(encode(results[1])) == [results[1]]
    # [4, tag 2 (results), layout 1 (a group), [three records]]; a 16-byte prompt is short: sent with each.
    assert data[:5] == b"\x94\x04\x02\x01\x93" and data.count(results[0].prompt_token_ids) == 3
    with pytest.raises(PayloadError, match="group of RolloutResults; read it with decode_entry"):
        decode(data)


def test_a_group_whose_records_carry_one_prompt_sends_it_once():
    prompt = pack_tokens(range(256))  # 1 KiB
    results = [make_result(sample_index=j, prompt_token_ids=prompt, tokens=[j] * 100) for j in range(16)]
    data = encode_entry(results)
    assert data[:4] == b"\x94\x04\x02\x02" and data.count(prompt) == 1
    back = decode_entry(data)
    assert back == results
    assert all(record.prompt_token_ids is back[0].prompt_token_ids for record in back)  # one object, not 16
    assert results[3].prompt_token_ids is prompt  # encoding left the caller's records as they were
    # One record with another prompt: every record carries its own.
    results[5] = make_result(sample_index=5, prompt_token_ids=pack_tokens(range(1, 257)), tokens=[5] * 100)
    data = encode_entry(results)
    assert data[:4] == b"\x94\x04\x02\x01" and data.count(prompt) == 15 and decode_entry(data) == results
    rewards = [RewardRecord.from_result(r, 1.0, 0.0, False) for r in results[:5]]
    assert decode_entry(encode_entry(rewards)) == rewards and encode_entry(rewards).count(prompt) == 1


def test_an_entry_of_another_wire_version_is_refused_by_name():
    data = bytearray(encode_entry([make_result(), make_result(sample_index=3)]))
    data[1] = 3
    with pytest.raises(PayloadError, match="wire version 4"):
        decode_entry(bytes(data))
    version_2_group = b"\x02\x00\x02\x00\x00\x00" + bytes(8)  # version, tag 0, uint32 count, lengths
    with pytest.raises(PayloadError, match="wire version 4"):
        decode_entry(version_2_group)


def test_bad_group_entries_are_rejected():
    with pytest.raises(PayloadError, match="at least one record"):
        encode_entry([])
    with pytest.raises(PayloadError, match="records of one type; got \\['RewardRecord', 'RolloutResult'\\]"):
        encode_entry([make_result(), RewardRecord.from_result(make_result(), 1.0, 0.0, False)])
    data = encode_entry([make_result(), make_result(sample_index=3)])
    with pytest.raises(PayloadError, match="corrupt record group of RolloutResults"):
        decode_entry(data[:-2])
    with pytest.raises(PayloadError, match="corrupt record group of RolloutResults"):
        decode_entry(data[:4] + b"\x92\x01\x02")  # a group of two integers
    prompt = pack_tokens(range(64))
    shared = encode_entry([make_result(prompt_token_ids=prompt), make_result(sample_index=3,
                                                                            prompt_token_ids=prompt)])
    with pytest.raises(PayloadError, match="carries its own"):  # a shared-prompt group's record with a prompt
        decode_entry(shared.replace(b"\xc4\x00", b"\xc4\x04\x01\x00\x00\x00", 1))


def test_logprobs_and_the_worker_travel_with_the_result():
    """The engine's log-probabilities travel packed, float32 like the token ids (4 bytes each); one per response
    token or none at all."""
    from services.streams.payloads import pack_logprobs, unpack_logprobs

    tokens = np.arange(64, dtype=np.uint32)
    logprobs = -np.linspace(0, 5, 64)
    result = make_result(tokens=tokens, worker="rollout-1", logprobs=pack_logprobs(logprobs))
    back = decode_entry(encode_entry([result, result]))[1]
    assert back.worker == "rollout-1"
    assert np.allclose(unpack_logprobs(back.logprobs), logprobs.astype(np.float32))
    reward = RewardRecord.from_result(back, 1.0, 0.0, False)
    assert reward.logprobs == back.logprobs and reward.reward == 1.0
    with pytest.raises(PayloadError, match="logprobs"):
        make_result(tokens=tokens, logprobs=pack_logprobs(logprobs[:3]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 0.5])
def test_a_result_whose_logprobs_are_not_finite_and_at_most_0_does_not_decode_and_names_its_record(bad):
    """Length is not enough: a NaN, an infinity or a positive log-probability from the engine is refused on decoding
    (single records, groups and groups sharing their prompt, results and rewards alike), naming the record by its key
    and the token; 0 and -0 are log-probabilities (a certain token)."""
    from services.streams.payloads import BadLogprobs, pack_logprobs

    good = pack_logprobs([-0.5, 0.0, -0.0, -20.0])
    poisoned = pack_logprobs([-0.5, -1.0, bad, -2.0])
    tokens, prompt = (5, 6, 7, 8), pack_tokens(range(32))  # a 128-byte prompt: groups send it once
    fine = make_result(tokens=tokens, logprobs=good, prompt_token_ids=prompt)
    sick = make_result(tokens=tokens, logprobs=poisoned, sample_index=5, prompt_token_ids=prompt)
    assert decode_entry(encode_entry([fine, fine]))[1].logprobs == good
    own_prompt = msgspec.structs.replace(sick, prompt_token_ids=pack_tokens([9]))
    rewards = [RewardRecord.from_result(r, 1.0, 0.0, False) for r in (fine, sick)]
    entries = [encode(sick), encode_entry([fine, sick]), encode_entry([fine, own_prompt]), encode_entry(rewards)]
    for entry in entries:
        with pytest.raises(BadLogprobs, match=r"run 'tiny', step 3, prompt 'row-17', sample 5 \(policy version 3\): "
                                              r"engine log-probability .* at response token 2 \(1 of 4 tokens"):
            decode_entry(entry)
        with pytest.raises(PayloadError) as refused:  # the consumer's existing dead-letter path catches it
            decode_entry(entry)
        assert refused.value.key == RecordKey("tiny", 3, "row-17", 5, 3)
    with pytest.raises(BadLogprobs):
        decode(encode(sick))
