"""The records that travel between actors on the Redis streams, and their wire encoding.

Three streams carry one record type each (docs/architecture.md):

    coordinator --RequestRecord--> rollout workers --RolloutResult--> verifiers --RewardNote--> coordinator

A request record carries one `pcl.engines.request.RolloutRequest` (the n samples of one prompt, with the engine's
own `SamplingParams`) and the run, step and policy version it is for; each result and reward is one sample. The
reward stream carries a `RewardNote`: the verdict and the id of the results-stream entry holding the sample, ~60 bytes
instead of a second copy of the ~16 KB sample; the coordinator joins the two into a `RewardRecord` (the
result plus its reward) when it collects the step (`services.streams.collector.StepCollector`). Every record has an
idempotency key `(run, step, prompt_id, sample_index, policy_version)` so that at-least-once delivery can
be turned into exactly-once collection (see `services.streams.collector.StepCollector`).

    data = encode(RolloutResult(...))   # bytes of one record
    record = decode(data)               # the same record back
    entry = encode_entry(results)       # one stream entry holding a group of records (a prompt's n samples)
    records = decode_entry(entry)

Token ids are packed little-endian uint32 bytes (`pack_tokens` / `unpack_tokens`), never JSON lists: a
2,048-token sample is 8 KiB on the wire and decodes with one `numpy.frombuffer`. The engine's log-probability of each
sampled token travels the same way, packed little-endian float32 (`pack_logprobs` / `unpack_logprobs`); a result whose
log-probabilities are not all finite numbers <= 0 does not decode (`BadLogprobs`, naming its key), so its consumer
dead-letters the entry like any malformed one (`services.streams.refusals` says what the coordinator does then).

Wire format (version 4): every entry is one MessagePack array `[version, tag, layout, body]`, so any
MessagePack reader can open it. Its first four bytes are fixed (0x94, then three small integers) and are
checked by hand; the body is decoded by msgspec straight into the record type named by the tag, each record
a MessagePack array of its fields in declaration order (strings as UTF-8, packed token ids as raw `bin`; a
request's `SamplingParams`, a dataclass, a map of its fields, validated by its own `__post_init__` on decoding).
Layouts: 0, the body is one record; 1, a group of records of one type (typically a prompt's n samples),
which divides the per-entry cost of Redis and its client by the group size; 2, a group whose records all
carry the same prompt (64 bytes or more), sent once: the body is `[prompt_token_ids, records]` with the
records' own prompt left empty, and every decoded record gets that one (immutable) bytes object back. The
records are msgspec Structs (C-level construction, no garbage-collector tracking: their fields are scalars,
strings and bytes, which cannot form cycles), so a 16 KB sample encodes in about 1 us and decodes in about
3 us; this codec is most of the Python cost of the stream layer (docs/queues.md).
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Sequence, Union

import msgspec
import numpy as np

from pcl.engines.request import RolloutRequest, SamplingParams
from services.streams.packed import (  # noqa: F401 - re-exported: the stream layer imports them here
    LOGPROB_DTYPE, TOKEN_DTYPE, PayloadError, check_packed, pack_logprobs, pack_tokens, unpack_logprobs,
    unpack_tokens)

# 4: a request's sampling is the engine's SamplingParams (with n); 3: MessagePack [version, tag, layout, body];
# 2 was a hand-packed struct layout
WIRE_VERSION = 4


class BadLogprobs(PayloadError):
    """A result whose engine log-probabilities are not log-probabilities (NaN, infinite, or above 0); `key` names
    the record, so the coordinator can tell which request's output was refused (`services.streams.refusals`)."""

    def __init__(self, message: str, key: "RecordKey"):
        super().__init__(message)
        self.key = key


class RecordKey(NamedTuple):
    """The idempotency key every record carries; two deliveries with the same key are the same sample."""

    run: str
    step: int
    prompt_id: str
    sample_index: int  # -1 for a request, which stands for all n samples of its prompt
    policy_version: int


def check_logprobs(records: Sequence["RolloutResult"]) -> None:
    """BadLogprobs naming the first record whose log-probabilities are not all finite and <= 0 (a NaN or an infinity
    from the engine would poison the learner's off-policy weights and log-prob gaps). One vectorised pass over the
    whole entry's values; the record and token are only looked for when it fails."""
    packed = b"".join(record.logprobs for record in records)
    if not packed:
        return
    values = np.frombuffer(packed, dtype=LOGPROB_DTYPE)
    if values.min() > -np.inf and values.max() <= 0:  # NaN fails both comparisons
        return
    for record in records:
        logprobs = unpack_logprobs(record.logprobs)
        bad = np.flatnonzero(~(np.isfinite(logprobs) & (logprobs <= 0)))
        if bad.size:
            key = record.key
            raise BadLogprobs(f"{type(record).__name__} of run {key.run!r}, step {key.step}, prompt {key.prompt_id!r}, "
                              f"sample {key.sample_index} (policy version {key.policy_version}): engine "
                              f"log-probability {logprobs[bad[0]]} at response token {bad[0]} ({bad.size} of "
                              f"{logprobs.size} tokens not a finite number <= 0)", key)


def _check_text(record: object, names: tuple[str, ...]) -> None:
    """Text fields must be str: caught when the record is built, not when a consumer fails to decode it."""
    for name in names:
        if not isinstance(getattr(record, name), str):
            got = type(getattr(record, name)).__name__
            raise PayloadError(f"{type(record).__name__}.{name} must be str, got {got}")


class _Wire(msgspec.Struct, array_like=True, gc=False):
    """Base of the records: encoded as MessagePack arrays of their fields; never tracked by the garbage
    collector (every field is a number, a string, bytes or a `SamplingParams` of numbers: no cycles are possible)."""


class RequestRecord(_Wire):
    """The stream record of one rollout request: the n samples of one prompt, generated with one exact policy
    version (coordinator -> rollout workers). `of` and `request` convert from and to the engine's
    `RolloutRequest`."""

    run: str  # run name; records of another run are never collected
    step: int  # training step t the samples are for
    policy_version: int  # weights the samples must come from; a worker never serves another version
    prompt_id: str  # stable id of the dataset row
    prompt_token_ids: bytes  # the templated prompt, packed uint32 (pack_tokens)
    # Sample index of the first of the n samples (they are first_index .. first_index + n - 1): a prompt asked
    # for again in a later generation round of the same step continues its indices, so no two rounds' records
    # share an idempotency key.
    first_index: int
    sampling: SamplingParams  # the engine's own: n, temperature, top-p, top-k, length limit, seed

    def __post_init__(self) -> None:
        check_packed("prompt_token_ids", self.prompt_token_ids)
        _check_text(self, ("run", "prompt_id"))
        if not isinstance(self.sampling, SamplingParams):
            raise PayloadError(f"RequestRecord.sampling must be SamplingParams, "
                               f"got {type(self.sampling).__name__}")
        if self.step < 0 or self.policy_version < 0 or self.first_index < 0:
            raise PayloadError(f"RequestRecord for prompt {self.prompt_id!r}: step ({self.step}), "
                               f"policy_version ({self.policy_version}) and first_index ({self.first_index}) "
                               f"must be >= 0")

    @classmethod
    def of(cls, run: str, step: int, policy_version: int, request: RolloutRequest) -> "RequestRecord":
        """The record of `request` for step `step` of run `run`, to be generated by policy `policy_version`."""
        return cls(run, step, policy_version, request.prompt_id, pack_tokens(request.prompt_token_ids),
                   request.first_index, request.sampling)

    def request(self) -> RolloutRequest:
        """The request this record carries."""
        return RolloutRequest(self.prompt_id, tuple(unpack_tokens(self.prompt_token_ids).tolist()), self.sampling,
                              self.first_index)

    @property
    def n(self) -> int:
        """Samples asked for."""
        return self.sampling.n

    @property
    def key(self) -> RecordKey:
        return RecordKey(self.run, self.step, self.prompt_id, -1, self.policy_version)


class RolloutResult(_Wire):
    """One generated sample of a request (rollout worker -> verifiers)."""

    run: str  # run name, copied from the request
    step: int  # training step, copied from the request
    prompt_id: str  # dataset row id, copied from the request
    sample_index: int  # which of the request's n samples this is: first_index .. first_index + n - 1
    policy_version: int  # weights that generated it (equal to the request's)
    prompt_token_ids: bytes  # the prompt, packed uint32, so the learner needs nothing else
    token_ids: bytes  # the generated response, packed uint32
    text: str  # the decoded response, what the verifier reads
    finish_reason: str  # "stop" (end of sequence) or "length" (hit max_new_tokens)
    generation_seconds: float  # wall time the engine spent on this request, per sample share
    worker: str = ""  # the rollout worker that generated it ("rollout-0", ...): the fleet's balance per step
    # log pi_engine of each response token, packed little-endian float32 (pack_logprobs); b"" when not reported
    logprobs: bytes = b""
    incarnation: str = ""  # the worker's process that generated it (services/incarnations.py: its node, host, pid)

    def __post_init__(self) -> None:
        check_packed("prompt_token_ids", self.prompt_token_ids)
        check_packed("token_ids", self.token_ids)
        if not isinstance(self.logprobs, bytes) or (self.logprobs and len(self.logprobs) != len(self.token_ids)):
            raise PayloadError(f"{type(self).__name__} for prompt {self.prompt_id!r}: logprobs must be b\"\" or one "
                               f"packed float32 per response token ({len(self.token_ids) // 4}), got "
                               f"{len(self.logprobs) if isinstance(self.logprobs, bytes) else '?'} bytes")
        _check_text(self, ("run", "prompt_id", "text", "finish_reason"))
        if self.step < 0 or self.sample_index < 0 or self.policy_version < 0:
            raise PayloadError(f"{type(self).__name__} for prompt {self.prompt_id!r}: step ({self.step}), "
                               f"sample_index ({self.sample_index}) and policy_version "
                               f"({self.policy_version}) must be >= 0")

    @property
    def key(self) -> RecordKey:
        return RecordKey(self.run, self.step, self.prompt_id, self.sample_index, self.policy_version)


class RewardRecord(RolloutResult):
    """A verified sample: the result and its reward (verifiers -> coordinator)."""

    # Defaults only because the result's last fields have them (msgspec); from_result / from_note set all four.
    reward: float = 0.0  # 1.0 if math-verify accepts the answer, else 0.0 (also for truncation and timeouts)
    verifier_seconds: float = 0.0  # wall time math-verify spent on the sample
    timed_out: bool = False  # the verifier hit its hard per-sample timeout (reward is then 0)
    verifier_error: bool = False  # the verifier could not score it (a worker error, twice): reward 0, not a verdict

    @classmethod
    def from_result(cls, result: RolloutResult, reward: float, verifier_seconds: float,
                    timed_out: bool, verifier_error: bool = False) -> "RewardRecord":
        return cls(*_RESULT_FIELDS(result), reward, verifier_seconds, timed_out, verifier_error)

    @classmethod
    def from_note(cls, note: "RewardNote", result: RolloutResult) -> "RewardRecord":
        """The record of a note joined with the result it points at; PayloadError if their keys differ."""
        if (result.sample_index != note.sample_index or result.prompt_id != note.prompt_id
                or result.step != note.step or result.policy_version != note.policy_version
                or result.run != note.run):
            raise PayloadError(f"reward note for {note.key} points at entry {note.result_entry} position "
                               f"{note.position}, which holds {result.key}")
        return cls(*_RESULT_FIELDS(result), note.reward, note.verifier_seconds, note.timed_out, note.verifier_error)


class RewardNote(_Wire):
    """The verdict on one sample, which stays in the results stream (verifiers -> coordinator).

    The coordinator joins it with the result it points at into a RewardRecord (RewardRecord.from_note)."""

    run: str  # run name, copied from the result
    step: int  # training step, copied from the result
    prompt_id: str  # dataset row id, copied from the result
    sample_index: int  # the sample's index, copied from the result
    policy_version: int  # weights that generated the sample, copied from the result
    reward: float  # 1.0 if math-verify accepts the answer, else 0.0 (also for truncation and timeouts)
    verifier_seconds: float  # wall time math-verify spent on the sample
    timed_out: bool  # the verifier hit its hard per-sample timeout (reward is then 0)
    result_entry: str  # id of the rollout_results stream entry that holds the sample
    position: int  # the sample's index among the records of that entry (0 for a single-record entry)
    verifier_error: bool = False  # the verifier could not score it (a worker error, twice): reward 0, not a verdict
    worker: str = ""  # the rollout worker that generated the sample, copied from the result
    incarnation: str = ""  # that worker's process, copied from the result: what a stale note is counted by
    verifier: str = ""  # the verifier that scored it, "verifier-0@<incarnation>": what a late note is counted by

    def __post_init__(self) -> None:
        _check_text(self, ("run", "prompt_id", "result_entry"))
        if self.step < 0 or self.sample_index < 0 or self.policy_version < 0 or self.position < 0:
            raise PayloadError(f"RewardNote for prompt {self.prompt_id!r}: step ({self.step}), sample_index "
                               f"({self.sample_index}), policy_version ({self.policy_version}) and position "
                               f"({self.position}) must be >= 0")

    @classmethod
    def of(cls, result: RolloutResult, result_entry: str, position: int, reward: float, verifier_seconds: float,
           timed_out: bool, verifier_error: bool = False, verifier: str = "") -> "RewardNote":
        return cls(result.run, result.step, result.prompt_id, result.sample_index, result.policy_version,
                   reward, verifier_seconds, timed_out, result_entry, position, verifier_error, result.worker,
                   result.incarnation, verifier)

    @property
    def key(self) -> RecordKey:
        return RecordKey(self.run, self.step, self.prompt_id, self.sample_index, self.policy_version)


Record = Union[RequestRecord, RolloutResult, RewardRecord, RewardNote]
_RESULT_FIELDS = operator.attrgetter(*RolloutResult.__struct_fields__)

_TAGS = {RequestRecord: 1, RolloutResult: 2, RewardRecord: 3, RewardNote: 4}
_BY_TAG = {tag: cls for cls, tag in _TAGS.items()}
_WITH_LOGPROBS = frozenset(tag for cls, tag in _TAGS.items() if "logprobs" in cls.__struct_fields__)
SINGLE, GROUP, GROUP_SHARED_PROMPT = 0, 1, 2  # the entry's layout (module docstring)
SHARED_MIN = 64  # a shorter common prompt is repeated: sending it once would save less than it costs
_HEADER = 4  # bytes: fixarray of 4 (0x94), version, tag, layout, each a positive fixint
_ENCODER = msgspec.msgpack.Encoder()
_DECODERS = {(tag, SINGLE): msgspec.msgpack.Decoder(cls) for cls, tag in _TAGS.items()}
_DECODERS.update({(tag, GROUP): msgspec.msgpack.Decoder(list[cls]) for cls, tag in _TAGS.items()})
_DECODERS.update({(tag, GROUP_SHARED_PROMPT): msgspec.msgpack.Decoder(tuple[bytes, list[cls]])
                  for cls, tag in _TAGS.items() if "prompt_token_ids" in cls.__struct_fields__})


def _tag(record: Record) -> int:
    tag = _TAGS.get(type(record))
    if tag is None:
        raise PayloadError(f"cannot encode {type(record).__name__}: not one of {[c.__name__ for c in _TAGS]}")
    return tag


def _encode(tag: int, layout: int, body: object, what: str) -> bytes:
    try:
        return _ENCODER.encode((WIRE_VERSION, tag, layout, body))
    except (msgspec.EncodeError, TypeError, OverflowError, UnicodeEncodeError) as exc:
        raise PayloadError(f"cannot encode {what}: {exc}") from None


def encode(record: Record) -> bytes:
    """One record -> the bytes of a single-record entry (see the module docstring for the layout)."""
    return _encode(_tag(record), SINGLE, record, f"{type(record).__name__} for prompt "
                                                 f"{getattr(record, 'prompt_id', '?')!r}")


def encode_entry(records: Record | Sequence[Record]) -> bytes:
    """One stream entry holding one record, or several of one type (a group, such as one prompt's n samples).

    Grouping amortises the per-entry cost of Redis and its client over the group: a stream entry of 16
    samples costs about a fifth of 16 entries of one sample each. A prompt all the records carry is sent
    once."""
    if not isinstance(records, (list, tuple)):
        return encode(records)
    if not records:
        raise PayloadError("an entry needs at least one record")
    if len(records) == 1:
        return encode(records[0])
    cls = type(records[0])
    tag = _tag(records[0])
    if any(type(record) is not cls for record in records):
        raise PayloadError(f"a group entry holds records of one type; got "
                           f"{sorted({type(record).__name__ for record in records})}")
    what = f"group of {len(records)} {cls.__name__}s for prompt {getattr(records[0], 'prompt_id', '?')!r}"
    prompt = getattr(records[0], "prompt_token_ids", b"")
    if len(prompt) >= SHARED_MIN and all(r.prompt_token_ids == prompt for r in records):
        blank = [msgspec.structs.replace(record, prompt_token_ids=b"") for record in records]
        return _encode(tag, GROUP_SHARED_PROMPT, (prompt, blank), what)
    return _encode(tag, GROUP, records, what)


def _header(data: bytes | memoryview) -> tuple[int, int]:
    """(tag, layout) of an entry; PayloadError unless it starts like a record of this wire version."""
    if len(data) < _HEADER or data[0] != 0x94 or data[1] != WIRE_VERSION or tuple(data[2:4]) not in _DECODERS:
        raise PayloadError(f"payload starting {bytes(data[:4])!r} is not a record of wire version "
                           f"{WIRE_VERSION} (a MessagePack array [{WIRE_VERSION}, tag in {sorted(_BY_TAG)}, "
                           f"layout, body])")
    return data[2], data[3]


def _decode_body(data: bytes | memoryview, tag: int, layout: int):
    try:
        return _DECODERS[tag, layout].decode(memoryview(data)[_HEADER:])
    except PayloadError:  # a field out of range (the record's own check)
        raise
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
        kind = _BY_TAG[tag].__name__ if layout == SINGLE else f"record group of {_BY_TAG[tag].__name__}s"
        raise PayloadError(f"corrupt {kind} payload: {exc}") from None


def decode(data: bytes | memoryview) -> Record:
    """The bytes of a single-record entry -> the record. Raises PayloadError naming what is wrong (BadLogprobs for a
    result whose log-probabilities are not finite numbers <= 0)."""
    tag, layout = _header(data)
    if layout != SINGLE:
        raise PayloadError(f"payload holds a group of {_BY_TAG[tag].__name__}s; read it with decode_entry")
    record = _decode_body(data, tag, layout)
    if tag in _WITH_LOGPROBS:
        check_logprobs([record])
    return record


def decode_entry(data: bytes | memoryview) -> list[Record]:
    """The records of one stream entry written by encode_entry (a single record gives a list of one); PayloadError
    as `decode`."""
    tag, layout = _header(data)
    body = _decode_body(data, tag, layout)
    records = [body] if layout == SINGLE else body if layout == GROUP else _shared_prompt(body)
    if tag in _WITH_LOGPROBS:
        check_logprobs(records)
    return records


def _shared_prompt(body: tuple[bytes, list[Record]]) -> list[Record]:
    """The records of a group that sends its prompt once, each given that prompt back."""
    prompt, records = body
    if len(prompt) % TOKEN_DTYPE.itemsize:
        raise PayloadError(f"record group's shared prompt has {len(prompt)} bytes, not packed uint32")
    for record in records:
        if record.prompt_token_ids:
            raise PayloadError("record group shares a prompt but one of its records carries its own")
        record.prompt_token_ids = prompt  # one object for the group, not n copies
    return records
