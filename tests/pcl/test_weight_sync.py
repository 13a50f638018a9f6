"""The weight-sync group (`pcl.weight_sync.collective`) on real torch.distributed gloo groups over 127.0.0.1: members are
threads of the test process, each with its own store client and process group."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from pcl.weight_sync.collective import WeightGroup, WeightSyncError, plan_buckets, tensor_specs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_buckets_hold_at_most_the_bucket_size_unless_one_tensor_is_larger():
    specs = [("a", "float32", (4,)), ("b", "float32", (4,)), ("c", "float32", (100,)), ("d", "bfloat16", (2,))]
    assert plan_buckets(specs, 32) == [[0, 1], [2], [3]]  # 16 + 16 bytes, 400 alone, 4
    assert plan_buckets(specs, 1 << 20) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(specs, 0)


def test_a_broadcast_reaches_every_receiver_bit_for_bit():
    state = {"w": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.bfloat16), "big": torch.randn(300),
             "ids": torch.arange(4), "scalar": torch.tensor(2.5)}
    port, received = free_port(), {1: {}, 2: {}}

    def receiver(rank: int) -> None:
        group = WeightGroup.open("127.0.0.1", port, rank, 3, "gloo", timeout_s=30)
        for bucket in group.receive():
            received[rank].update({name: tensor.clone() for name, tensor in bucket})

    threads = [threading.Thread(target=receiver, args=(rank,)) for rank in (1, 2)]
    for thread in threads:
        thread.start()
    sender = WeightGroup.open("127.0.0.1", port, 0, 3, "gloo", timeout_s=30)
    sent = sender.broadcast(state, bucket_bytes=64)
    for thread in threads:
        thread.join(30)
    assert sent == sum(t.numel() * t.element_size() for t in state.values())
    for rank in (1, 2):
        assert list(received[rank]) == list(state)
        for name, tensor in state.items():
            assert received[rank][name].dtype == tensor.dtype and torch.equal(received[rank][name], tensor)
    assert tensor_specs(state)[1] == ("b", "bfloat16", (7,))


def test_the_next_bucket_travels_while_the_receiver_loads_the_current_one():
    """Double buffering: while the receiver holds bucket 0 (vLLM loading it), bucket 1 is already received, so
    the sender finishes without waiting for the load; every bucket stays intact until the end."""
    state = {"a": torch.randn(64), "b": torch.randn(64)}  # 256 bytes each: two buckets of 256
    port, held, sender_done = free_port(), [], threading.Event()

    def send() -> None:
        WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=30).broadcast(state, bucket_bytes=256)
        sender_done.set()

    sender = threading.Thread(target=send)
    sender.start()
    buckets = WeightGroup.open("127.0.0.1", port, 1, 2, "gloo", timeout_s=30).receive()
    held.extend(next(buckets))
    assert sender_done.wait(10), "the sender waited for the receiver to finish loading bucket 0"
    held.extend(pair for bucket in buckets for pair in bucket)
    sender.join(10)
    assert [name for name, _ in held] == ["a", "b"]
    assert all(torch.equal(tensor, state[name]) for name, tensor in held)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_group_that_cannot_form_times_out_naming_the_address(rank):
    port = free_port()  # nobody else joins (rank 0 waits for rank 1; rank 1 finds no store)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=rf"group at 127.0.0.1:{port} \(gloo, rank {rank} of 2\) did not form "
                                              r"within 2 s"):
        WeightGroup.open("127.0.0.1", port, rank, 2, "gloo", timeout_s=2)
    assert time.monotonic() - start < 20


def failing_receiver(port: int, errors: list[str], timeout_s: float) -> threading.Thread:
    """Rank 1 of a 2-member gloo group on `port`, started in a thread, receiving until the group fails; the
    WeightSyncError's message goes to `errors`."""

    def receiver() -> None:
        group = WeightGroup.open("127.0.0.1", port, 1, 2, "gloo", timeout_s=timeout_s)
        try:
            list(group.receive())
        except WeightSyncError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=receiver)
    thread.start()
    return thread


def test_a_header_with_an_unknown_dtype_is_refused():
    port, errors = free_port(), []
    thread = failing_receiver(port, errors, timeout_s=30)
    sender = WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=30)
    header = torch.frombuffer(bytearray(b'[[["x", "complex_evil", [1]]], 8]'), dtype=torch.uint8)
    sender._broadcast(torch.tensor([header.numel()]))
    sender._broadcast(header)
    thread.join(30)
    assert errors and "complex_evil" in errors[0]


def test_the_collective_route_needs_the_vllm_engine():
    from pydantic import ValidationError

    from pcl.config import RolloutConfig

    with pytest.raises(ValidationError, match="weight_sync=collective needs engine=vllm"):
        RolloutConfig(weight_sync="collective")
    assert RolloutConfig(engine="vllm", weight_sync="collective").weight_sync_bucket_mb == 256
    assert RolloutConfig().weight_sync == "rpc"


def test_rank_0_hosts_the_rendezvous_on_the_port_it_handed_out_held_all_along():
    """The port is reserved bound (nobody else can take it between the hand-over and the group's forming) and
    the group forms on that very socket."""
    from pcl.weight_sync.collective import reserve_port

    listener = reserve_port("127.0.0.1")
    port = listener.getsockname()[1]
    with socket.socket() as intruder, pytest.raises(OSError):
        intruder.bind(("127.0.0.1", port))  # held: a bind-then-close port would be free here
    received = {}

    def receiver() -> None:
        group = WeightGroup.open("127.0.0.1", port, 1, 2, "gloo", timeout_s=30)
        received.update((name, t.clone()) for bucket in group.receive() for name, t in bucket)
        group.close()

    thread = threading.Thread(target=receiver)
    thread.start()
    sender = WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=30, listen_socket=listener)
    sender.broadcast({"w": torch.arange(6.0)})
    thread.join(30)
    sender.close()
    listener.close()
    assert torch.equal(received["w"], torch.arange(6.0))


def test_a_lost_peer_is_a_weight_sync_error_within_the_timeout_and_the_group_is_aborted():
    """Rank 0 never sends (it is gone): the receiver's wait ends at the group's timeout with WeightSyncError, its
    group is aborted at once, and a later use says the group must be formed again instead of hanging."""
    port, formed = free_port(), threading.Event()
    done = threading.Event()

    def silent_sender() -> None:
        group = WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=30)
        formed.set()
        done.wait(30)
        group.abort()

    thread = threading.Thread(target=silent_sender)
    thread.start()
    receiver = WeightGroup.open("127.0.0.1", port, 1, 2, "gloo", timeout_s=3)
    assert formed.wait(30)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=rf"group at 127.0.0.1:{port} failed \(group aborted\)"):
        list(receiver.receive())
    assert time.monotonic() - start < 15  # the 3 s timeout, not a hang
    assert receiver.group is None
    with pytest.raises(WeightSyncError, match="closed"):
        list(receiver.receive())
    done.set()
    thread.join(30)


def test_the_barrier_names_the_device():
    from datetime import timedelta

    from pcl.weight_sync.collective import _barrier_options

    assert list(_barrier_options(torch.device("cpu"), timedelta(seconds=5)).device_ids) == []
    assert list(_barrier_options(torch.device("cuda:3"), timedelta(seconds=5)).device_ids) == [3]
    assert _barrier_options(torch.device("cpu"), timedelta(seconds=5)).timeout == timedelta(seconds=5)



def test_a_lazy_source_is_sent_bucket_by_bucket_never_held_whole():
    """With the tensors' specs given up front, the sender pulls tensors from the iterable as it packs each bucket:
    while a tensor is being produced, at most the buckets in flight (two) and the one being packed are alive, not
    the whole state (a learner's streaming gather yields each full tensor once)."""
    import gc
    import weakref

    state = {f"w{i}": torch.full((256,), float(i)) for i in range(12)}  # 1 KiB each, one a bucket
    alive, most_alive, received, port = [], [0], {}, free_port()

    def source():
        for name, tensor in state.items():
            gc.collect()
            alive[:] = [ref for ref in alive if ref() is not None]
            most_alive[0] = max(most_alive[0], len(alive))
            produced = tensor.clone()  # a fresh tensor, as a gather makes
            alive.append(weakref.ref(produced))
            yield name, produced

    def receiver() -> None:
        group = WeightGroup.open("127.0.0.1", port, 1, 2, "gloo", timeout_s=30)
        received.update((name, t.clone()) for bucket in group.receive() for name, t in bucket)

    thread = threading.Thread(target=receiver)
    thread.start()
    sender = WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=30)
    sent = sender.broadcast(source(), bucket_bytes=1024, specs=tensor_specs(state))
    thread.join(30)
    assert sent == 12 * 1024 and list(received) == list(state)
    assert all(torch.equal(received[name], tensor) for name, tensor in state.items())
    assert most_alive[0] <= 3, f"{most_alive[0]} produced tensors alive at once: the source was read ahead"


def test_a_source_that_disagrees_with_its_specs_aborts_the_group_and_the_receiver_is_told():
    port, errors = free_port(), []
    specs = [("a", "float32", (4,)), ("b", "float32", (4,))]
    thread = failing_receiver(port, errors, timeout_s=5)
    sender = WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=5)
    with pytest.raises(WeightSyncError, match=r"'c' float32 \(4,\), the header declared 'b' float32 \(4,\)"):
        sender.broadcast(iter([("a", torch.zeros(4)), ("c", torch.zeros(4))]), bucket_bytes=16, specs=specs)
    assert sender.group is None  # aborted: the receivers are not left waiting for a bucket that never comes
    thread.join(30)
    assert errors, "the receiver was not told"


def test_a_tied_name_the_sender_left_out_is_received_as_the_tensor_it_is_tied_to():
    """The sender skips lm_head.weight (the engine ties it to the embedding); a receiver that names the tie gets the
    embedding's tensor under both names, in the same bucket, without its bytes travelling twice."""
    state = {"model.embed_tokens.weight": torch.randn(8, 4), "model.norm.weight": torch.ones(4)}
    port, received = free_port(), {}
    aliases = {"lm_head.weight": "model.embed_tokens.weight"}

    def receiver() -> None:
        group = WeightGroup.open("127.0.0.1", port, 1, 2, "gloo", timeout_s=30)
        for bucket in group.receive(aliases=aliases):
            received.update((name, tensor.clone()) for name, tensor in bucket)

    thread = threading.Thread(target=receiver)
    thread.start()
    sender = WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=30)
    sent = sender.broadcast(state, bucket_bytes=16)
    thread.join(30)
    assert sent == (8 * 4 + 4) * 4  # the head's bytes did not travel
    assert list(received) == ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    assert torch.equal(received["lm_head.weight"], state["model.embed_tokens.weight"])


def test_a_tie_is_read_from_the_model_that_shares_the_tensor():
    """`tied_aliases`: names whose parameter is another name's very tensor (vLLM's tied lm_head), first name first;
    equal values in separate tensors are not a tie."""
    from pcl.engines.vllm import tied_aliases

    tied = torch.nn.Module()
    tied.embed = torch.nn.Embedding(8, 4)
    tied.head = torch.nn.Linear(4, 8, bias=False)
    tied.head.weight = tied.embed.weight
    assert tied_aliases(tied) == {"head.weight": "embed.weight"}
    untied = torch.nn.Module()
    untied.embed = torch.nn.Embedding(8, 4)
    untied.head = torch.nn.Linear(4, 8, bias=False)
    with torch.no_grad():
        untied.head.weight.copy_(untied.embed.weight)
    assert tied_aliases(untied) == {}
    assert tied_aliases(tied.to("meta")) == {}  # nothing to share on the meta device (a reload in progress)
    emptied = torch.nn.Module()  # vLLM's CPU build empties the weights of the linear layers it repacked
    emptied.a, emptied.b = torch.nn.Parameter(torch.empty(0)), torch.nn.Parameter(torch.empty(0))
    assert tied_aliases(emptied) == {}
