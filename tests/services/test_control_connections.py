"""The control plane's connections to Redis do not grow with its load, on a private Redis whose clients are this
test's only: started as `pcl train` starts it (services.control.server.DriverControl), then asked by 32 clients at
once while the driver relays the event log to the trackers, as it does every second. The connections it holds are
the same after the burst as at its start, and no more than its pool's bound.

Before, its Redis client opened a connection for each thread that found every other one in use (up to the 40 threads
FastAPI serves requests on, and the driver's own), and kept it: the 60-minute soak saw the run's Redis gain a
descriptor, with the driver, whenever requests overlapped more than they had before (docs/operations.md, "Long
runs")."""

from __future__ import annotations

import threading

import httpx
import pytest

from pcl.config import load_config
from services.control.server import CONTROL_REDIS_CONNECTIONS, DriverControl
from services.redis_server import make_client
from tests.services.control_fixtures import AUTH, TOKEN, step_record

pytestmark = pytest.mark.redis
CLIENTS, REQUESTS = 32, 20


def test_the_control_planes_redis_connections_do_not_grow_with_its_load(embedded_redis_url, tmp_path):
    admin = make_client(embedded_redis_url, decode_responses=True)
    me = admin.client_id()

    def held() -> int:  # every connection to this Redis but the test's own
        return sum(1 for c in admin.client_list() if int(c["id"]) != me)

    cfg = load_config(None, ["run.name=conns", "control.port=0", f"control.token={TOKEN}"])
    plane = DriverControl(cfg, embedded_redis_url, tmp_path, k_max=8, fresh=True)
    try:
        for step in range(1, 40):
            plane.store.add_history(step_record(step))
        at_start = held()
        go, errors = threading.Barrier(CLIENTS + 1), []

        def ask(i: int) -> None:
            with httpx.Client(base_url=plane.server.url, timeout=120) as api:
                go.wait()
                for j in range(REQUESTS):
                    path = ("/v1/status", "/v1/history?limit=1000", "/metrics", "/v1/events?limit=20")[(i + j) % 4]
                    answer = api.get(path, headers=AUTH)
                    if answer.status_code != 200:
                        errors.append((path, answer.status_code))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        go.wait()
        for _ in range(CLIENTS * REQUESTS // 4):  # the driver's relay of the event log, as it follows the run
            plane.store.events(limit=1000)
        for thread in threads:
            thread.join()
        assert not errors, errors[:5]
        after = held()
        assert after <= CONTROL_REDIS_CONNECTIONS, f"{after} connections after {CLIENTS} clients at once (at the start: {at_start})"
        assert after == at_start, f"{at_start} connections at the start, {after} after the burst"
        names = {c["name"] for c in admin.client_list() if int(c["id"]) != me}
        assert names == {"pcl-control"}, names  # a soak counts the connections of each client by this name
    finally:
        plane.close()
        admin.close()
