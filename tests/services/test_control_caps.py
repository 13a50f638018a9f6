"""What the control state keeps grows to its cap and no further, on a real Redis: the history (one record a step,
HISTORY_MAXLEN of them) through the coordinator's own write, and the event log (about EVENTS_MAXLEN events). The caps
are lowered here so that a few hundred writes pass them; the bytes a real step record takes are measured and the
history's size at its real cap printed (a soak's report gives the same from a run)."""

from __future__ import annotations

import pytest

import services.control.state as state
import services.control.writes as writes
from services.control.state import HISTORY_MAXLEN
from tests.services.control_fixtures import api, server, step_record, store  # noqa: F401 - fixtures

pytestmark = pytest.mark.redis
CAP = 300


def test_the_history_grows_to_its_cap_and_no_further(store, monkeypatch):  # noqa: F811 - fixture
    monkeypatch.setattr(writes, "HISTORY_MAXLEN", CAP)
    client = store.client
    sizes = {}
    for step in range(1, 2 * CAP + 1):
        store.add_history(step_record(step, train_reward_mean=step / 1000, rollout_samples_by_worker={"0": 512}))
        if step in (CAP // 2, CAP, 3 * CAP // 2, 2 * CAP):
            sizes[step] = client.memory_usage(store.history_key, samples=0)
    assert client.zcard(store.history_key) == CAP
    assert [r["step"] for r in store.history(-1, 5)] == list(range(CAP + 1, CAP + 6))  # the newest CAP steps
    assert sizes[2 * CAP] <= sizes[CAP] * 1.02 and sizes[3 * CAP // 2] <= sizes[CAP] * 1.02  # flat past the cap
    per_record = (sizes[CAP] - sizes[CAP // 2]) / (CAP // 2)
    assert 200 < per_record < 5000
    print(f"history: {per_record:.0f} bytes a record in Redis; at its cap of {HISTORY_MAXLEN:,} records about "
          f"{per_record * HISTORY_MAXLEN / 1e6:.0f} MB")


def test_the_event_log_stays_near_its_cap(store, monkeypatch):  # noqa: F811 - fixture
    monkeypatch.setattr(state, "EVENTS_MAXLEN", CAP)
    for i in range(3 * CAP):
        store.add_event("tau_requested", "api", value=0.5 + i / 1e4)
    length = store.client.xlen(store.events_key)
    assert CAP <= length <= CAP + 100  # XADD MAXLEN ~ trims whole radix-tree nodes (100 entries each here)


def test_a_history_page_stays_under_its_byte_cap_however_large_the_records(store, api):  # noqa: F811 - fixtures
    """A page of /v1/history holds at most HISTORY_PAGE records and about HISTORY_PAGE_BYTES of them, whatever a
    record weighs (a soak's 1,000 records of about 3.5 kB each answered 3.2 MB); `more` says whether to page on,
    and paging with `after` reads every record once."""
    from services.control.api import HISTORY_PAGE, HISTORY_PAGE_BYTES

    wide = {f"bin_{i}": 0.123456789012345 + i for i in range(100)}  # ~3 kB a record, as real full-precision figures
    steps = 1200
    for step in range(1, steps + 1):
        store.add_history(step_record(step, trained_reliability_predicted=wide))
    seen, after, pages = [], -1, 0
    while True:
        answer = api.get("/v1/history", params={"after": after})
        assert answer.status_code == 200
        assert len(answer.content) <= HISTORY_PAGE_BYTES + 4096, len(answer.content)
        page = answer.json()
        assert 1 <= len(page["records"]) <= HISTORY_PAGE
        seen += [r["step"] for r in page["records"]]
        after, pages = seen[-1], pages + 1
        if not page["more"]:
            break
    assert seen == list(range(1, steps + 1))
    assert pages >= 4  # 3.6 MB of records in pages of at most 1 MiB
    small = api.get("/v1/history", params={"after": steps - 3}).json()
    assert [r["step"] for r in small["records"]] == [steps - 2, steps - 1, steps] and small["more"] is False
