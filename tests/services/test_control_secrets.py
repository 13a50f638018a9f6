"""Secrets where the driver starts the control plane (services.control.server.DriverControl), on real Redis
servers: a weak PCL_API_TOKEN is refused by name, and a Redis password given as `?password=` or in the user
part never reaches RUN_DIR/control.json."""

from __future__ import annotations

import json

import pytest

from pcl.config import ConfigError, load_config
from services.control.server import DriverControl

pytestmark = pytest.mark.redis


def test_a_weak_token_from_the_environment_is_refused_by_name(redis_url, key_prefix, redis_client, tmp_path,
                                                              monkeypatch, capsys):
    for weak in ("short-token", "replace-me-with-a-long-random-token"):
        monkeypatch.setenv("PCL_API_TOKEN", weak)
        with pytest.raises(ConfigError, match="PCL_API_TOKEN") as info:
            DriverControl(load_config(None, [f"run.name={key_prefix}", "control.port=0"]), redis_url, tmp_path,
                          k_max=8, fresh=True)
        assert weak not in str(info.value) and weak not in capsys.readouterr().out


@pytest.mark.parametrize("form", ["query", "userinfo"])
def test_control_json_never_holds_the_redis_password(embedded_redis, key_prefix, tmp_path, form):
    password = "pw0rd-" + key_prefix.rsplit(":", 1)[-1]
    client = embedded_redis.client()
    client.config_set("requirepass", password)
    try:
        host_port = embedded_redis.tcp_url.removeprefix("redis://").removesuffix("/0")
        url = (f"redis://{host_port}/0?password={password}" if form == "query"
               else f"redis://default:{password}@{host_port}/0")
        cfg = load_config(None, [f"run.name={key_prefix}", "control.enabled=false"])
        DriverControl(cfg, url, tmp_path, k_max=8, fresh=True, tools_url=url).close()
        text = (tmp_path / "control.json").read_text()
        assert password not in text and "***" in json.loads(text)["redis_url"], text
    finally:
        client.execute_command("AUTH", password)
        client.config_set("requirepass", "")
        client.close()
