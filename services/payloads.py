"""The records that travel between actors on the Redis streams, and their wire encoding.

Three streams carry one record type each (DESIGN.md section 2):

    coordinator --RolloutRequest--> rollout workers --RolloutResult--> verifiers --RewardNote--> coordinator

A request asks for the n samples of one prompt; each result and reward is one sample. The reward stream
carries a `RewardNote`: the verdict and the id of the results-stream entry holding the sample, ~100 bytes
instead of a second copy of the ~16 KB sample; the coordinator joins the two into a `RewardRecord` (the
result plus its reward) when it collects the step (`services.queues.StepCollector`). Every record has an
idempotency key `(run, step, prompt_id, sample_index, policy_version)` so that at-least-once delivery can
be turned into exactly-once collection (see `services.queues.StepCollector`).

    data = encode(RolloutResult(...))   # bytes of one record
    record = decode(data)               # the same record back
    entry = encode_entry(results)       # one stream entry holding a group of records (a prompt's n samples)
    records = decode_entry(entry)

Token ids are packed little-endian uint32 bytes (`pack_tokens` / `unpack_tokens`), never JSON lists: a
2,048-token sample is 8 KiB on the wire and decodes with one `numpy.frombuffer`. The wire format is

    version (uint8) | record tag (uint8) | numbers (int64 / float64 / bool, LE) | section lengths (uint32 LE) | sections

where the fixed part is one `struct` per record type (numbers, then the byte length of each variable
section) and the sections (strings as UTF-8, packed token ids as they are) follow it back to back. Decoding
costs a few microseconds per record, which matters at tens of thousands of samples per second. A group
entry is `version | tag 0 | record count (uint32) | one uint32 length per record | the encoded records`;
in a group, a later record's section equal to the first record's (the prompt tokens of a prompt's n
samples, 1 KiB at 256 tokens) has the length SHARED (0xFFFFFFFF) and is not repeated.
"""

from __future__ import annotations

import dataclasses
import operator
import struct
from dataclasses import dataclass
from typing import NamedTuple, Sequence, Union

import numpy as np

WIRE_VERSION = 2  # 2: a group entry may share a section with its first record (SHARED)
TOKEN_DTYPE = np.dtype("<u4")  # vocabularies of Qwen3 / Llama (150k+) need more than 16 bits


class PayloadError(ValueError):
    """Bytes that are not an encoded record, or a record with a field out of range."""


class RecordKey(NamedTuple):
    """The idempotency key every record carries; two deliveries with the same key are the same sample."""

    run: str
    step: int
    prompt_id: str
    sample_index: int  # -1 for a request, which stands for all n samples of its prompt
    policy_version: int


def pack_tokens(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Token ids -> little-endian uint32 bytes (4 bytes per token). Raises PayloadError on ids outside uint32."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1:
        raise PayloadError(f"token ids must be one-dimensional, got shape {ids.shape}")
    if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() > np.iinfo(np.uint32).max):
        raise PayloadError(f"token ids must be integers in [0, 2**32), got dtype {ids.dtype} "
                           f"with range [{ids.min()}, {ids.max()}]")
    return ids.astype(TOKEN_DTYPE, copy=False).tobytes()


def unpack_tokens(packed: bytes) -> np.ndarray:
    """Packed bytes -> read-only uint32 array of shape [num_tokens] (a view, no copy)."""
    if len(packed) % TOKEN_DTYPE.itemsize:
        raise PayloadError(f"packed token ids have {len(packed)} bytes, not a multiple of {TOKEN_DTYPE.itemsize}")
    return np.frombuffer(packed, dtype=TOKEN_DTYPE)


def _check_packed(name: str, packed: bytes) -> None:
    if not isinstance(packed, (bytes, bytearray)) or len(packed) % TOKEN_DTYPE.itemsize:
        raise PayloadError(f"{name} must be packed uint32 bytes (see pack_tokens), got {type(packed).__name__} "
                           f"of length {len(packed) if hasattr(packed, '__len__') else '?'}")


@dataclass(slots=True)
class SamplingParams:
    """How a rollout worker samples; the same for the n samples of one request."""

    temperature: float = 1.0  # softmax temperature; 0 means greedy
    top_p: float = 1.0  # nucleus sampling mass; 1 disables
    top_k: int = -1  # keep the k most likely tokens; -1 disables
    max_new_tokens: int = 4096  # responses reaching this are truncated (finish_reason "length", reward 0)
    seed: int | None = None  # per-request seed for reproducible sampling; None lets the engine choose

    def __post_init__(self) -> None:
        if self.seed is not None and self.seed < 0:
            raise PayloadError(f"sampling seed must be >= 0 or None, got {self.seed}")

    @property
    def wire_seed(self) -> int:
        """The seed as the wire carries it: -1 stands for None."""
        return -1 if self.seed is None else self.seed


@dataclass(slots=True)
class RolloutRequest:
    """Generate n samples of one prompt with one exact policy version (coordinator -> rollout workers)."""

    run: str  # run name; records of another run are never collected
    step: int  # training step t the samples are for
    prompt_id: str  # stable id of the dataset row
    prompt_token_ids: bytes  # the templated prompt, packed uint32 (pack_tokens)
    n: int  # samples to generate for this prompt
    policy_version: int  # weights the samples must come from; a worker never serves another version
    sampling: SamplingParams  # temperature, top-p, top-k, length limit, seed
    # Sample index of the first of the n samples (they are first_index .. first_index + n - 1): a prompt asked
    # for again in a later generation round of the same step continues its indices, so no two rounds' records
    # share an idempotency key.
    first_index: int = 0

    def __post_init__(self) -> None:
        _check_packed("prompt_token_ids", self.prompt_token_ids)
        if self.step < 0 or self.n < 1 or self.policy_version < 0 or self.first_index < 0:
            raise PayloadError(f"RolloutRequest for prompt {self.prompt_id!r}: step ({self.step}), "
                               f"policy_version ({self.policy_version}) and first_index ({self.first_index}) "
                               f"must be >= 0 and n ({self.n}) >= 1")

    @property
    def key(self) -> RecordKey:
        return RecordKey(self.run, self.step, self.prompt_id, -1, self.policy_version)


@dataclass(slots=True)
class RolloutResult:
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

    def __post_init__(self) -> None:
        _check_packed("prompt_token_ids", self.prompt_token_ids)
        _check_packed("token_ids", self.token_ids)
        if self.step < 0 or self.sample_index < 0 or self.policy_version < 0:
            raise PayloadError(f"{type(self).__name__} for prompt {self.prompt_id!r}: step ({self.step}), "
                               f"sample_index ({self.sample_index}) and policy_version "
                               f"({self.policy_version}) must be >= 0")

    @property
    def key(self) -> RecordKey:
        return RecordKey(self.run, self.step, self.prompt_id, self.sample_index, self.policy_version)


@dataclass(slots=True)
class RewardRecord(RolloutResult):
    """A verified sample: the result and its reward (verifiers -> coordinator)."""

    reward: float  # 1.0 if math-verify accepts the answer, else 0.0 (also for truncation and timeouts)
    verifier_seconds: float  # wall time math-verify spent on the sample
    timed_out: bool  # the verifier hit its hard per-sample timeout (reward is then 0)

    @classmethod
    def from_result(cls, result: RolloutResult, reward: float, verifier_seconds: float,
                    timed_out: bool) -> "RewardRecord":
        return cls(*_RESULT_FIELDS(result), reward, verifier_seconds, timed_out)


    @classmethod
    def from_note(cls, note: "RewardNote", result: RolloutResult) -> "RewardRecord":
        """The record of a note joined with the result it points at; PayloadError if their keys differ."""
        if result.key != note.key:
            raise PayloadError(f"reward note for {note.key} points at entry {note.result_entry} position "
                               f"{note.position}, which holds {result.key}")
        return cls(*_RESULT_FIELDS(result), note.reward, note.verifier_seconds, note.timed_out)


@dataclass(slots=True)
class RewardNote:
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

    def __post_init__(self) -> None:
        if self.step < 0 or self.sample_index < 0 or self.policy_version < 0 or self.position < 0:
            raise PayloadError(f"RewardNote for prompt {self.prompt_id!r}: step ({self.step}), sample_index "
                               f"({self.sample_index}), policy_version ({self.policy_version}) and position "
                               f"({self.position}) must be >= 0")

    @classmethod
    def of(cls, result: RolloutResult, result_entry: str, position: int, reward: float, verifier_seconds: float,
           timed_out: bool) -> "RewardNote":
        return cls(result.run, result.step, result.prompt_id, result.sample_index, result.policy_version,
                   reward, verifier_seconds, timed_out, result_entry, position)

    @property
    def key(self) -> RecordKey:
        return RecordKey(self.run, self.step, self.prompt_id, self.sample_index, self.policy_version)


Record = Union[RolloutRequest, RolloutResult, RewardRecord, RewardNote]
_RESULT_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(RolloutResult)))


class _Codec:
    """The wire layout of one record type: a fixed struct of numbers and section lengths, then sections.

    `layout` lists (attribute path, kind) in constructor order; kinds are struct codes for numbers
    ("q" int64, "d" float64, "?" bool) and "s" (UTF-8 text) or "b" (raw bytes) for variable sections.
    """

    def __init__(self, cls: type, tag: int, layout: list[tuple[str, str]]) -> None:
        self.cls, self.tag = cls, tag
        numbers = [name for name, kind in layout if kind in "qd?"]
        self.sections = [(name, kind) for name, kind in layout if kind in "sb"]
        self.fixed = struct.Struct("<BB" + "".join(k for _, k in layout if k in "qd?") + "I" * len(self.sections))
        self.get_numbers = operator.attrgetter(*numbers)
        self.get_sections = operator.attrgetter(*(name for name, _ in self.sections))
        self.is_text = [kind == "s" for _, kind in self.sections]
        section_names = [name for name, _ in self.sections]
        # For each constructor argument: (True, its section index) or (False, its number index).
        self.order = [(True, section_names.index(name)) if kind in "sb" else (False, numbers.index(name))
                      for name, kind in layout]

    def encode_parts(self, record: Record, first: Record | None = None) -> list[bytes]:
        """The record's bytes as a list of parts, so that a group is joined (copied) only once. Sections of
        SHARED_MIN bytes or more that equal those of `first` (a group's first record) are left out."""
        values = self.get_sections(record)
        shared = [False] * len(values)
        if first is not None:
            shared = [len(v) >= SHARED_MIN and (v is f or v == f) for v, f in zip(values, self.get_sections(first))]
        sections = [b"" if same else v.encode("utf-8") if text else v
                    for v, text, same in zip(values, self.is_text, shared)]
        lengths = [SHARED if same else len(s) for s, same in zip(sections, shared)]
        return [self.fixed.pack(WIRE_VERSION, self.tag, *self.get_numbers(record), *lengths), *sections]

    def decode(self, data: bytes | memoryview, first: Record | None = None) -> Record:
        values = self.fixed.unpack_from(data)
        n_numbers = len(values) - 2 - len(self.sections)
        numbers, lengths = values[2:2 + n_numbers], values[2 + n_numbers:]
        if SHARED in lengths and first is None:
            raise PayloadError(f"{self.cls.__name__} payload shares a section but is not a later record of a group")
        if self.fixed.size + sum(n for n in lengths if n != SHARED) != len(data):
            raise PayloadError(f"{self.cls.__name__} payload of {len(data)} bytes does not match its "
                               f"section lengths {list(lengths)}")
        sections, start = [], self.fixed.size
        base = self.get_sections(first) if SHARED in lengths else ()
        for i, (length, text) in enumerate(zip(lengths, self.is_text)):
            if length == SHARED:  # the group's first record holds it: the same (immutable) object
                sections.append(base[i])
                continue
            chunk = data[start:start + length]  # a copy of bytes, a view of a memoryview: bytes() copies once
            sections.append(str(chunk, "utf-8") if text else bytes(chunk))
            start += length
        args = [sections[i] if is_section else numbers[i] for is_section, i in self.order]
        return self.build(args)

    def build(self, args: list) -> Record:
        if self.cls is RolloutRequest:  # five sampling parameters, then first_index
            *head, temperature, top_p, top_k, max_new_tokens, seed, first_index = args
            sampling = SamplingParams(temperature, top_p, top_k, max_new_tokens, None if seed < 0 else seed)
            return RolloutRequest(*head, sampling, first_index)
        return self.cls(*args)


SHARED = 0xFFFFFFFF  # the section length of a group's later record that repeats its first record's section
SHARED_MIN = 64  # shorter sections are repeated: comparing them would cost more than it saves

_RESULT_LAYOUT = [("run", "s"), ("step", "q"), ("prompt_id", "s"), ("sample_index", "q"), ("policy_version", "q"),
                  ("prompt_token_ids", "b"), ("token_ids", "b"), ("text", "s"), ("finish_reason", "s"),
                  ("generation_seconds", "d")]
_CODECS = {
    RolloutRequest: _Codec(RolloutRequest, 1, [
        ("run", "s"), ("step", "q"), ("prompt_id", "s"), ("prompt_token_ids", "b"), ("n", "q"),
        ("policy_version", "q"), ("sampling.temperature", "d"), ("sampling.top_p", "d"), ("sampling.top_k", "q"),
        ("sampling.max_new_tokens", "q"), ("sampling.wire_seed", "q"), ("first_index", "q")]),
    RolloutResult: _Codec(RolloutResult, 2, _RESULT_LAYOUT),
    RewardRecord: _Codec(RewardRecord, 3, _RESULT_LAYOUT + [("reward", "d"), ("verifier_seconds", "d"),
                                                             ("timed_out", "?")]),
    RewardNote: _Codec(RewardNote, 4, [
        ("run", "s"), ("step", "q"), ("prompt_id", "s"), ("sample_index", "q"), ("policy_version", "q"),
        ("reward", "d"), ("verifier_seconds", "d"), ("timed_out", "?"), ("result_entry", "s"), ("position", "q")]),
}
_BY_TAG = {codec.tag: codec for codec in _CODECS.values()}


def encode(record: Record) -> bytes:
    """One record -> its bytes (see the module docstring for the layout)."""
    return b"".join(_encode_parts(record))


def _encode_parts(record: Record, first: Record | None = None) -> list[bytes]:
    codec = _CODECS.get(type(record))
    if codec is None:
        raise PayloadError(f"cannot encode {type(record).__name__}: not one of {[c.__name__ for c in _CODECS]}")
    try:
        return codec.encode_parts(record, first if type(first) is type(record) else None)
    except (struct.error, AttributeError, UnicodeEncodeError, TypeError) as exc:
        raise PayloadError(f"cannot encode {type(record).__name__} for prompt "
                           f"{getattr(record, 'prompt_id', '?')!r}: {exc}") from None


def decode(data: bytes | memoryview, first: Record | None = None) -> Record:
    """The bytes of one record -> the record (`first`: the first record of its group, whose sections it may
    share). Raises PayloadError naming what is wrong."""
    if len(data) < 2 or data[0] != WIRE_VERSION or data[1] not in _BY_TAG:
        raise PayloadError(f"payload starting {bytes(data[:2])!r} is not a record of wire version "
                           f"{WIRE_VERSION} (tags {sorted(_BY_TAG)})")
    codec = _BY_TAG[data[1]]
    try:
        return codec.decode(data, first if type(first) is codec.cls else None)
    except PayloadError:
        raise
    except (struct.error, UnicodeDecodeError, TypeError, ValueError) as exc:
        raise PayloadError(f"corrupt {codec.cls.__name__} payload: {exc}") from None


_GROUP_TAG = 0  # an entry carrying several records, e.g. the n samples of one prompt
_GROUP_HEAD = struct.Struct("<BBI")  # version, tag 0, record count; then one uint32 length per record


def encode_entry(records: Record | Sequence[Record]) -> bytes:
    """One stream entry holding one record, or several (a group, such as one prompt's n samples).

    Grouping amortises the per-entry cost of Redis and its client over the group: a stream entry of 16
    samples costs about a fifth of 16 entries of one sample each."""
    if not isinstance(records, (list, tuple)):
        return encode(records)
    if len(records) == 1:
        return encode(records[0])
    if not records:
        raise PayloadError("an entry needs at least one record")
    parts = [_encode_parts(record, records[0] if i else None) for i, record in enumerate(records)]
    lengths = struct.pack(f"<{len(parts)}I", *(sum(map(len, record_parts)) for record_parts in parts))
    head = _GROUP_HEAD.pack(WIRE_VERSION, _GROUP_TAG, len(parts))
    return b"".join([head, lengths, *(part for record_parts in parts for part in record_parts)])


def decode_entry(data: bytes) -> list[Record]:
    """The records of one stream entry written by encode_entry (a single record gives a list of one)."""
    if len(data) < 2 or data[0] != WIRE_VERSION or data[1] != _GROUP_TAG:
        return [decode(data)]
    try:
        _, _, count = _GROUP_HEAD.unpack_from(data)
        lengths = struct.unpack_from(f"<{count}I", data, _GROUP_HEAD.size)
    except struct.error as exc:
        raise PayloadError(f"corrupt record group: {exc}") from None
    start = _GROUP_HEAD.size + 4 * count
    if start + sum(lengths) != len(data):
        raise PayloadError(f"record group of {len(data)} bytes does not match its {count} record lengths")
    records, view = [], memoryview(data)  # views: each record's bytes are copied once, by its decode
    for length in lengths:
        records.append(decode(view[start:start + length], records[0] if records else None))
        start += length
    return records
