"""Starting the control plane as `pcl train` does (services.control.server.DriverControl), on a real Redis:
the token rules, where it binds, what a fresh and a resumed run keep, and a taken port as a clear error."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from pcl.config import ConfigError, load_config
from services.control.server import DriverControl
from services.control.run import RunControl
from tests.services.control_fixtures import step_record, store  # noqa: F401 - a fixture

pytestmark = pytest.mark.redis


def config(run: str, *overrides: str):
    return load_config(None, [f"run.name={run}", "control.port=0", *overrides])


def test_a_generated_token_is_printed_once_and_forces_localhost(
    redis_url, key_prefix, redis_client, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("PCL_API_TOKEN", raising=False)
    plane = DriverControl(
        config(key_prefix, "control.host=0.0.0.0"), redis_url, tmp_path, k_max=8, fresh=True
    )
    try:
        out = capsys.readouterr().out
        token = out.split("choose one): ")[1].split()[0]
        assert "binding 127.0.0.1, not 0.0.0.0" in out and plane.server.host == "127.0.0.1"
        info = json.loads((tmp_path / "control.json").read_text())
        assert info["url"] == plane.server.url and token not in json.dumps(info)
        r = httpx.post(f"{plane.server.url}/v1/pause", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 202
    finally:
        plane.close()


def test_a_configured_token_is_not_printed(
    redis_url, key_prefix, redis_client, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("PCL_API_TOKEN", "from-the-environment-0123456789abcdef")
    plane = DriverControl(config(key_prefix), redis_url, tmp_path, k_max=8, fresh=True)
    try:
        assert "from-the-environment-0123456789abcdef" not in capsys.readouterr().out
        r = httpx.post(
            f"{plane.server.url}/v1/pause", headers={"Authorization": "Bearer from-the-environment-0123456789abcdef"}
        )
        assert r.status_code == 202
    finally:
        plane.close()


def test_a_fresh_run_forgets_and_a_resumed_run_keeps_the_control_state(redis_url, store, tmp_path):
    cfg = config(store.run, "control.enabled=false")
    DriverControl(cfg, redis_url, tmp_path, k_max=8, fresh=True).close()
    assert json.loads((tmp_path / "control.json").read_text())["url"] is None  # nothing served
    store.request_params(tau=0.3)
    store.request_pause()
    rc = RunControl(store)
    rc.publish(step_record(4), 4)
    rc.finish(4)  # the run ended; it is resumed later
    assert store.status()["state"] == "finished"

    DriverControl(cfg, redis_url, tmp_path, k_max=8, fresh=False).close()
    status = store.status()
    assert (
        status["state"] == "waiting"
        and status["pause_requested"]
        and status["pending_params"] == {"tau": 0.3}
    )
    assert [r["step"] for r in store.history()] == [4]
    store.request_resume()  # no longer refused as finished

    DriverControl(cfg, redis_url, tmp_path, k_max=8, fresh=True).close()
    assert store.history() == [] and store.events() == [] and not store.desired().paused


def test_a_taken_port_is_a_config_error(redis_url, key_prefix, redis_client, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"control.port = {port}: cannot listen"):
            DriverControl(
                config(key_prefix, f"control.port={port}"), redis_url, tmp_path, k_max=8, fresh=True
            )
