"""Throughput of the Redis stream layer: sample records per second through request -> result -> reward.

    python -m bench.queues                   # an embedded Redis 6.2 on a Unix socket, as a default run uses
    python -m bench.queues --appendonly      # the same with the AOF fsynced on every write (the run default)
    python -m bench.queues --url redis://127.0.0.1:6379/0 --consumers 1 2 4 --steps 3

Generation and verification are free here (pre-built records), so what is measured is only the plumbing
the actors pay: encoding, XADD, XREADGROUP, decoding, MULTI/EXEC forwarding with XACK, collection into a
StepCollector and trimming at commit. Records are realistic: every sample carries a 256-token prompt and a
2,048-token response as packed uint32 (8 KiB) plus ~7 KB of response text, so a RewardRecord is ~16 KB.

Each configuration runs `consumers` rollout-worker processes and as many verifier processes, and the
coordinator in this process; a step of m prompts x n samples is put, collected until complete, and
committed (streams trimmed) before the next. The figure is samples committed per wall-clock second over
the measured steps (one warm-up step is not counted). The plumbing's share of a step at the paper's
m=512, n=16 is (m*n / rate) divided by the generation time per step given by --generation-s (stated
with its assumption in the output). The last line ends with the best end-to-end records-per-second figure.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import numpy as np

from bench import add_json_option, run, write_figures

from pcl.engines import SamplingParams
from services.streams.payloads import (
    RequestRecord, RewardNote, RewardRecord, RolloutResult, decode, encode, encode_entry, pack_tokens,
)
from services.streams.heap import keep_freed_heap
from services.streams.collector import StepCollector
from services.streams.queues import WorkQueue
from services.streams.topology import TOPOLOGY, open_queue, stream_key
from services.redis_server import connect, make_client, masked, start_embedded

PROMPT_TOKENS, RESPONSE_TOKENS, TEXT_CHARS = 256, 2048, 7000
# Default generation time per step at m=512, n=16: 8,192 samples x ~2,048 tokens = 16.8 M tokens; at an
# assumed ~190k generated tokens/s (vLLM, a 4B policy on one node of 8 H100s) that is ~90 s.
DEFAULT_GENERATION_S = 90.0
PROMPT = pack_tokens(np.arange(PROMPT_TOKENS) + 1000)  # one prompt for every request: 1 KiB packed


def queue(client, run: str, name: str, consumer: str, **options) -> WorkQueue:
    return open_queue(client, run, name, consumer, **options)


class Worker:
    """A stage process's shared signals: `measuring` marks the timed steps, `stop` ends the loop, and the
    process reports the CPU seconds it spent while measuring through `cpu_out`."""

    def __init__(self, ctx) -> None:
        self.measuring, self.stop, self.cpu_out = ctx.Event(), ctx.Event(), ctx.Queue()

    def loop(self, turn) -> None:
        cpu_start = None
        while not self.stop.is_set():
            if cpu_start is None and self.measuring.is_set():
                cpu_start = time.process_time()
            turn()
        self.cpu_out.put(time.process_time() - (cpu_start or time.process_time()))


def rollout_worker(url: str, run: str, name: str, signals: Worker, max_in_flight: int) -> None:
    """Serve requests with pre-built 2,048-token samples; each request's n results go out as one entry,
    with the request's ack, in one MULTI."""
    client = make_client(url)
    requests = queue(client, run, "rollout_requests", name, max_in_flight=max_in_flight, block_ms=50)
    results = queue(client, run, "rollout_results", name)
    rng = np.random.default_rng(sum(map(ord, name)))
    # The n samples of a prompt differ (tokens and text), as they do from a real policy: only the prompt's
    # tokens repeat within a group entry, so the encoding shares nothing else.
    responses = [pack_tokens(rng.integers(0, 151_000, RESPONSE_TOKENS)) for _ in range(64)]
    texts = [sample_text(j) for j in range(64)]

    def turn() -> None:
        deliveries = requests.take()
        if deliveries:
            groups = [[RolloutResult(r.run, r.step, r.prompt_id, j, r.policy_version, r.prompt_token_ids,
                                     responses[j % 64], texts[j % 64], "stop", 0.0) for j in range(r.n)]
                      for r in (d.record for d in deliveries)]
            requests.forward(deliveries, results, groups)

    signals.loop(turn)


def verifier_worker(url: str, run: str, name: str, signals: Worker, max_in_flight: int) -> None:
    """Reward every result (1.0 for even sample indices); one entry of reward notes per result group,
    forwarded with the ack."""
    client = make_client(url)
    results = queue(client, run, "rollout_results", name, max_in_flight=max_in_flight, block_ms=50)
    rewards = queue(client, run, "rewards", name)

    def turn() -> None:
        deliveries = results.take()
        if deliveries:
            groups = [[RewardNote.of(r, d.id, i, float(r.sample_index % 2 == 0), 0.0, False)
                       for i, r in enumerate(d.records)] for d in deliveries]
            results.forward(deliveries, rewards, groups)

    signals.loop(turn)


def run_step(coordinator: dict[str, WorkQueue], run: str, step: int, m: int, n: int) -> StepCollector:
    """Put m requests, collect the m*n rewards exactly once, commit (trim all three streams)."""
    sampling = SamplingParams(n=n, max_new_tokens=4096)
    requests = [RequestRecord(run, step, step, f"row-{step}-{i}", PROMPT, 0, sampling) for i in range(m)]
    collector = StepCollector(run, step, step, {(f"row-{step}-{i}", j) for i in range(m) for j in range(n)},
                              resolve=coordinator["rollout_results"].join)
    coordinator["rollout_requests"].put(requests)
    deadline = time.monotonic() + 300
    while not collector.complete:
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step}: {len(collector.missing)} samples missing")
        deliveries = coordinator["rewards"].take(256)
        collector.offer_all(record for d in deliveries for record in d.records)
        coordinator["rewards"].ack(deliveries)
    for stream in coordinator.values():
        stream.trim_committed()
    return collector


def redis_cpu_seconds(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def bench_consumers(url: str, consumers: int, steps: int, m: int, n: int) -> tuple[float, float]:
    """(samples per second end to end, CPU microseconds per sample over all processes and Redis) with
    `consumers` rollout workers and as many verifiers."""
    run = f"bench{os.getpid()}c{consumers}"
    client = make_client(url)
    coordinator = {name: queue(client, run, name, "coordinator", max_in_flight=1 << 20) for name in TOPOLOGY}
    ctx = mp.get_context("spawn")
    signals = Worker(ctx)
    workers = [ctx.Process(target=rollout_worker, args=(url, run, f"rollout{i}", signals, 16)) for i in range(consumers)]
    workers += [ctx.Process(target=verifier_worker, args=(url, run, f"verifier{i}", signals, 32)) for i in range(consumers)]
    for worker in workers:
        worker.start()
    try:
        run_step(coordinator, run, 0, m, n)  # warm-up: processes started, connections open
        signals.measuring.set()
        time.sleep(0.2)  # every worker notes its CPU clock before the first timed step
        start, cpu_start, redis_start = time.perf_counter(), time.process_time(), redis_cpu_seconds(client)
        for step in range(1, steps + 1):
            collector = run_step(coordinator, run, step, m, n)
            assert collector.complete and len(collector.records) == m * n
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start + redis_cpu_seconds(client) - redis_start
    finally:
        signals.stop.set()
        worker_cpu = [signals.cpu_out.get(timeout=30) for worker in workers if worker.is_alive() or worker.exitcode == 0]
        for worker in workers:
            worker.join(timeout=10)
        client.delete(*[stream_key(run, name) for name in TOPOLOGY])
    samples, cpu = steps * m * n, cpu + sum(worker_cpu)
    return samples / elapsed, cpu / samples * 1e6


def transport_floor(url: str, samples: int = 8192, group: int = 16) -> float:
    """CPU microseconds per sample (this process + Redis) to move the same bytes with bare redis-py along the
    same path: pre-encoded result groups XADDed, XREADGROUPed and XACKed; note groups XADDed, XREADGROUPed
    and XACKed; the result groups read back by id (XRANGE). No record is built, encoded or decoded. The
    limit the queue layer is compared with."""
    client = make_client(url)
    results = [sample_result(j) for j in range(group)]
    notes = [RewardNote.of(r, "1-1", j, 1.0, 0.0, False) for j, r in enumerate(results)]
    payloads = {"results": encode_entry(results), "notes": encode_entry(notes)}
    streams = {name: f"benchfloor{os.getpid()}:{name}" for name in payloads}
    for stream in streams.values():
        client.xgroup_create(stream, "g", id="0", mkstream=True)
    cpu_start, redis_start = time.process_time(), redis_cpu_seconds(client)
    result_ids = []
    for name in ("results", "notes"):
        stream = streams[name]
        for _ in range(samples // group // 16):
            pipe = client.pipeline(transaction=True)
            for _ in range(16):
                pipe.xadd(stream, {b"d": payloads[name]})
            ids = pipe.execute()
            if name == "results":
                result_ids += ids
        while reply := client.xreadgroup("g", "c", {stream: ">"}, count=16):
            client.xack(stream, "g", *[entry_id for entry_id, _ in reply[0][1]])
    for start in range(0, len(result_ids), 64):
        pipe = client.pipeline(transaction=False)
        for entry_id in result_ids[start:start + 64]:
            pipe.xrange(streams["results"], entry_id, entry_id, count=1)
        pipe.execute()
    cpu = time.process_time() - cpu_start + redis_cpu_seconds(client) - redis_start
    client.delete(*streams.values())
    return cpu / samples * 1e6


def sample_text(sample_index: int) -> str:
    """~7 KB of response text, different for every sample index."""
    return (f"Sample {sample_index}. " + "Let x be the number of apples; then 3x + 4 = 19, so x = 5. " * 200)[:TEXT_CHARS]


def sample_result(sample_index: int = 3) -> RolloutResult:
    """A realistic result; samples of different indices share the prompt only."""
    response = pack_tokens((np.arange(RESPONSE_TOKENS) * 73 + sample_index * 7919) % 151_000)
    return RolloutResult("bench", 1, "row-1", sample_index, 1, PROMPT, response, sample_text(sample_index),
                         "stop", 1.0)


def sample_reward(sample_index: int = 3) -> RewardRecord:
    return RewardRecord.from_result(sample_result(sample_index), 1.0, 0.01, False)


def codec_micro(repeats: int = 5000) -> tuple[float, float, int]:
    """Microseconds to encode and to decode one realistic RewardRecord, and its size in bytes."""
    record = sample_reward()
    start = time.perf_counter()
    for _ in range(repeats):
        data = encode(record)
    middle = time.perf_counter()
    for _ in range(repeats):
        decode(data)
    end = time.perf_counter()
    return (middle - start) / repeats * 1e6, (end - middle) / repeats * 1e6, len(data)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="Redis to use (default: a fresh embedded server)")
    parser.add_argument("--appendonly", action="store_true", help="embedded server with AOF, fsync on every write")
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per configuration")
    parser.add_argument("--m", type=int, default=512)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--generation-s", type=float, default=DEFAULT_GENERATION_S,
                        help="generation time per step at m=512, n=16 the plumbing is compared with")
    add_json_option(parser)
    args = parser.parse_args(argv)
    # Every WorkQueue applies the heap settings to its process; the floor below is measured before this
    # process has one, so it gets them here: the layer and the floor run under the same allocator settings.
    heap = keep_freed_heap()

    handle = None
    if args.url:
        url = connect(args.url).url
    else:
        handle = start_embedded(appendonly=args.appendonly)
        url = handle.url
    info = make_client(url).info("server")
    where = "embedded" if handle else "external"
    aof = make_client(url).config_get("appendonly").get("appendonly")
    heap_note = "applied" if heap else "not applied (PCL_KEEP_FREED_HEAP=0, or not glibc)"
    print(f"Redis {info['redis_version']} ({where}, appendonly={aof}) at {masked(url)}; "
          f"{os.cpu_count()} CPU cores; heap settings {heap_note} (services/streams/heap.py)")
    encode_us, decode_us, size = codec_micro()
    note = len(encode(RewardNote.of(sample_result(), "1732000000000-0", 3, 1.0, 0.01, False)))
    print(f"RewardRecord: {size:,} bytes ({RESPONSE_TOKENS} response tokens packed = {4 * RESPONSE_TOKENS:,} B); "
          f"encode {encode_us:.1f} us, decode {decode_us:.1f} us; the RewardNote on the reward stream: {note} bytes")
    group = [sample_result(j) for j in range(16)]
    print(f"a result entry of 16 samples: {len(encode_entry(group)):,} bytes (16 single records: "
          f"{sum(len(encode(r)) for r in group):,}; only the prompt's tokens are written once)")
    floor_us = transport_floor(url)
    print(f"transport floor (bare redis-py, same bytes, groups of 16): {floor_us:.0f} CPU us/sample, "
          f"{2e6 / floor_us:,.0f} samples/s on two idle cores")
    print(f"{'consumers':>9} {'samples/s':>10} {'MB/s':>6} {'CPU us/sample':>14} {'2-core cap':>11} "
          f"{'plumbing s/step':>16} {'share':>7}")
    rates, cpu_per_sample = {}, {}
    try:
        for consumers in args.consumers:
            rate, cpu_us = bench_consumers(url, consumers, args.steps, args.m, args.n)
            rates[consumers], cpu_per_sample[consumers] = rate, cpu_us
            step_cost = 512 * 16 / rate
            print(f"{consumers:>9} {rate:>10,.0f} {rate * size / 1e6:>6,.0f} {cpu_us:>14.0f} {2e6 / cpu_us:>11,.0f} "
                  f"{step_cost:>16.3f} {step_cost / args.generation_s:>7.2%}", flush=True)
    finally:
        if handle is not None:
            handle.close()
    best = max(rates, key=rates.get)
    print("MB/s: reward bytes committed per second. CPU us/sample: CPU time of every process (coordinator, "
          "workers, Redis) per sample; 2-core cap: 2 s / that, the rate two idle cores could sustain.")
    print(f"share: plumbing time of a step at m=512, n=16 (8,192 / rate) over an assumed {args.generation_s:.0f} s "
          f"of generation per step (8,192 x 2,048 tokens at ~190k tokens/s); an upper bound, since the "
          f"streams flow while generation runs")
    print(f"the layer costs {min(cpu_per_sample.values()) / floor_us:.1f}x the bare transport's CPU per sample")
    print(f"end-to-end sample records per second (best, {best} consumer{'s' if best > 1 else ''} per stage): "
          f"{rates[best]:.0f}")
    return write_figures(args.json, {
        "redis_version": info["redis_version"], "where": where, "appendonly": aof, "record_bytes": size,
        "encode_us": encode_us, "decode_us": decode_us, "transport_floor_cpu_us_per_sample": floor_us,
        "samples_per_second": rates, "cpu_us_per_sample": cpu_per_sample, "best_consumers": best,
        "layer_over_floor": min(cpu_per_sample.values()) / floor_us})


if __name__ == "__main__":
    run(main)
