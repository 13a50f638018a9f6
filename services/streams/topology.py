"""The run's stream topology, declared once: the streams that carry work between the actors, the one consumer
group that takes each, the role that writes it, the role whose members take it, the roles that read it back,
and its dead-letter limits.

    rollout = open_role(client, run, "rollout", "rollout-0", cfg.redis, max_in_flight=cfg.rollout.max_in_flight)
    requests, results = rollout["rollout_requests"], rollout["rollout_results"]

Every work queue of a run is opened here (`open_queue`, `open_role`) from `STREAMS`: an actor names its role,
never a stream key or a group. Adding a stream is one `Stream(...)` in `STREAMS` (and the code that writes and
reads its records); the table of docs/queues.md is `topology_table()`, checked by tests/services/test_topology.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from pcl.config import RedisConfig
from services.streams.queues import DEAD_LETTER_MAX_BYTES, WorkQueue

if TYPE_CHECKING:
    import redis

# The actors that touch the streams; a member's consumer name is "{role}-{index}" ("coordinator" for the one
# coordinator), which the fleet test checks against each group's consumers.
ROLES = ("coordinator", "rollout", "verifier")


@dataclass(frozen=True)
class Stream:
    """One work stream of a run, at key pcl:{run}:{name}."""

    name: str
    record: str  # the record type of its entries (services.streams.payloads), one per entry or a group
    producer: str  # the role that writes entries (put, or forward with its ack of the stream it consumes)
    group: str  # the one consumer group whose members take entries
    consumer: str  # the role whose members are that group's consumers
    readers: tuple[str, ...] = ()  # roles that read entries back by id (WorkQueue.fetch), taking nothing
    max_in_flight: int = 1024  # un-acked deliveries one consumer holds, unless its opener gives another bound
    bound_by: str = ""  # the config key its consumers pass as that bound instead, if any
    dead_letter_maxlen: int = 10_000  # an entry failed or abandoned redis.max_deliveries times goes to
    dead_letter_max_bytes: int = DEAD_LETTER_MAX_BYTES  # {key}:dead, capped by count and by bytes

    def roles(self) -> tuple[str, ...]:
        """Every role that opens this stream."""
        return tuple(dict.fromkeys((self.producer, self.consumer, *self.readers)))


STREAMS = (
    Stream("rollout_requests", "RequestRecord", producer="coordinator", group="rollout", consumer="rollout",
           bound_by="rollout.max_in_flight"),
    Stream("rollout_results", "RolloutResult", producer="rollout", group="verifier", consumer="verifier",
           readers=("coordinator",)),  # the coordinator joins each reward note with the result it points at
    Stream("rewards", "RewardNote", producer="verifier", group="coordinator", consumer="coordinator",
           max_in_flight=1 << 20),  # the coordinator holds a whole step's notes until it acks them
)
TOPOLOGY = {stream.name: stream for stream in STREAMS}
STREAM_GROUPS = {stream.name: stream.group for stream in STREAMS}


def declared(name: str) -> Stream:
    """The declaration of stream `name`; ValueError naming the declared streams when there is none."""
    try:
        return TOPOLOGY[name]
    except KeyError:
        raise ValueError(f"unknown stream {name!r}; streams are {sorted(TOPOLOGY)} (services/streams/topology.py)") from None


def stream_key(run: str, name: str) -> str:
    """Redis key of one of the run's streams: pcl:{run}:{name}, name declared in STREAMS."""
    return f"pcl:{run}:{declared(name).name}"


def run_of(key: str) -> str:
    """The run a stream key belongs to: the inverse of `stream_key` (pcl:{run}:{name} -> run)."""
    prefix, _, name = key.rpartition(":")
    if not prefix.startswith("pcl:") or name not in TOPOLOGY:
        raise ValueError(f"{key!r} is not the key of a declared stream, pcl:{{run}}:{{name}}")
    return prefix[len("pcl:"):]


def streams_of(role: str) -> tuple[Stream, ...]:
    """The streams `role` writes, takes from or reads back, in declaration order."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles are {list(ROLES)} (services/streams/topology.py)")
    return tuple(stream for stream in STREAMS if role in stream.roles())


def open_queue(client: redis.Redis, run: str, name: str, consumer: str, cfg: RedisConfig | None = None, *,
               max_in_flight: int | None = None, **options) -> WorkQueue:
    """The run's stream `name` for `consumer` of its declared group, with the visibility timeout, delivery limit,
    blocking read, reconnect and full timeouts of the `redis` config section and the stream's declared bounds;
    max_in_flight overrides the declared backpressure bound (rollout.max_in_flight for a rollout worker).
    `options` override any of them (tests)."""
    stream, cfg = declared(name), cfg or RedisConfig()
    settings = dict(visibility_timeout_s=cfg.visibility_timeout_s, max_deliveries=cfg.max_deliveries,
                    block_ms=cfg.block_ms, max_in_flight=max_in_flight or stream.max_in_flight,
                    reconnect_timeout_s=cfg.reconnect_timeout_s, full_timeout_s=cfg.full_timeout_s,
                    dead_letter_maxlen=stream.dead_letter_maxlen, dead_letter_max_bytes=stream.dead_letter_max_bytes)
    return WorkQueue(client, stream_key(run, name), stream.group, consumer, **{**settings, **options})


def open_role(client: redis.Redis, run: str, role: str, consumer: str, cfg: RedisConfig | None = None, *,
              max_in_flight: int | None = None, **options) -> dict[str, WorkQueue]:
    """Every stream `role` touches, by name, opened for `consumer`; max_in_flight bounds the streams the role
    takes from (the others it only writes or reads back)."""
    return {stream.name: open_queue(client, run, stream.name, consumer, cfg, **options,
                                    max_in_flight=max_in_flight if stream.consumer == role else None)
            for stream in streams_of(role)}


def topology_table(streams: Sequence[Stream] = STREAMS) -> str:
    """The declaration as the Markdown table of docs/queues.md."""
    rows = ["| stream (key `pcl:{run}:<stream>`) | record | written by | group | taken by | read back by | "
            "consumer holds at most | dead letters kept |", "|---|---|---|---|---|---|---|---|"]
    for s in streams:
        bound = f"`{s.bound_by}`" if s.bound_by else f"{s.max_in_flight:,}"
        rows.append(f"| `{s.name}` | `{s.record}` | {s.producer} | `{s.group}` | {s.consumer} | "
                    f"{', '.join(s.readers) or '-'} | {bound} | {s.dead_letter_maxlen:,} entries, "
                    f"{s.dead_letter_max_bytes // 2**20} MiB |")
    return "\n".join(rows)
