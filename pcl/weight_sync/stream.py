"""The learner's side of the collective route: every learner rank takes part in gathering the weights, learner
rank 0 sends them into the weight-sync group as they are gathered.

    sent = send_weights(learner, group, bucket_bytes, skip=("lm_head.weight",))   # rank 0; returns bytes sent
    send_weights(learner, None, bucket_bytes, skip=("lm_head.weight",))           # every other learner rank

`learner` is a `pcl.models.learner.PolicyLearner` (anything with its `weight_specs` and `stream_weights`). The
weights come from the learner's own device (the GPU with NCCL, CPU tensors on a CPU learner: the same code),
gathered one group of about `bucket_bytes` at a time and packed into the broadcast's buckets as they come, so
rank 0 never holds the whole state, and nothing passes through host memory on the way. `skip` names weights the
receivers do not need sent (a tied `lm_head.weight` their model shares with the embedding:
`pcl.engines.vllm.tied_aliases`); the receivers take the tied tensor for them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator


def send_weights(learner, group, bucket_bytes: int, skip: Collection[str] = ()) -> int:
    """Gather the learner's weights (a collective: every learner rank calls this) and, on the rank holding the
    weight-sync `group` (rank 0; None elsewhere), broadcast them bucket by bucket; returns the bytes sent.

    When the broadcast fails midway the rest of the stream is still gathered, so the other learner ranks are not
    left waiting in a gather; the broadcast's error is raised after that."""
    stream = learner.stream_weights(bucket_bytes, skip)
    if group is None:
        _drain(stream)
        return 0
    try:
        return group.broadcast(stream, bucket_bytes, specs=learner.weight_specs(skip))
    except BaseException:
        _drain(stream)
        raise


def _drain(stream: Iterator) -> None:
    for _ in stream:
        pass
