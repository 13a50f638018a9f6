"""Token ids and log-probabilities as the stream records carry them: little-endian uint32 and float32 bytes, 4 a
token, unpacked as read-only views without a copy (`services.streams.payloads` builds its records on these and
re-exports every name here)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

TOKEN_DTYPE = np.dtype("<u4")  # vocabularies of Qwen3 / Llama (150k+) need more than 16 bits
LOGPROB_DTYPE = np.dtype("<f4")  # a sampled token's log-probability as the engine reported it


class PayloadError(ValueError):
    """Bytes that are not an encoded record, or a record with a field out of range."""


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


def pack_logprobs(logprobs: Sequence[float] | np.ndarray) -> bytes:
    """Log-probabilities -> little-endian float32 bytes (4 bytes per token, like pack_tokens)."""
    return np.asarray(logprobs, dtype=LOGPROB_DTYPE).reshape(-1).tobytes()


def unpack_logprobs(packed: bytes) -> np.ndarray:
    """Packed bytes -> read-only float32 array of shape [num_tokens] (a view, no copy)."""
    if len(packed) % LOGPROB_DTYPE.itemsize:
        raise PayloadError(f"packed log-probabilities have {len(packed)} bytes, not a multiple of 4")
    return np.frombuffer(packed, dtype=LOGPROB_DTYPE)


def check_packed(name: str, packed: bytes) -> None:
    if not isinstance(packed, bytes) or len(packed) % TOKEN_DTYPE.itemsize:
        raise PayloadError(f"{name} must be packed uint32 bytes (see pack_tokens), got {type(packed).__name__} "
                           f"of length {len(packed) if hasattr(packed, '__len__') else '?'}")
