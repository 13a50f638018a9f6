"""Secrets in configuration and output: the API token's rules, masked Redis passwords, redacted `pcl config`
and config errors that name the key but never the token."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from pcl.config import ConfigError, dump_config, load_config, redacted
from pcl.credentials import MIN_TOKEN_CHARS, check_token, mask_url

REPO = Path(__file__).resolve().parents[2]
GOOD = secrets.token_hex(20)  # 40 characters


@pytest.mark.parametrize("token", ["short", "s3cret-test-token", "a" * (MIN_TOKEN_CHARS - 1),
                                   "replace-me-with-a-long-random-token", "REPLACE-ME-0123456789abcdef0123456789",
                                   "changeme-changeme-changeme-changeme", "x" * 64, "ababababababababababababababababab"])
def test_short_and_placeholder_tokens_are_refused_without_echoing_them(token):
    with pytest.raises(ValueError, match="control.token") as info:
        check_token(token, "control.token")
    assert token not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"control.token={token}"])
    assert token not in str(info.value) and "control.token" in str(info.value)


def test_a_long_random_token_is_accepted():
    assert check_token(GOOD, "control.token") == GOOD
    assert load_config(None, [f"control.token={GOOD}"]).control.token == GOOD


def test_config_errors_never_echo_the_token():
    for overrides in ([f"control.token={GOOD}", "control.bogus=1"], [f"control.token={GOOD}", "control.port=-1"],
                      ["control.token=123456789012345678901234567890123456"], ["control.token=[a, b]"]):
        with pytest.raises(ConfigError) as info:
            load_config(None, overrides)
        message = str(info.value)
        assert GOOD not in message and "123456789012345678901234567890123456" not in message, message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw0rd@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:pw0rd@h:6379/0", "rediss://user:***@h:6379/0"),
        ("redis://h:6379/0?password=pw0rd", "redis://h:6379/0?password=***"),
        ("redis://h:6379/0?db=1&password=pw0rd&ssl_cert_reqs=none", "redis://h:6379/0?db=1&password=***&ssl_cert_reqs=none"),
        ("unix:///run/redis.sock?password=pw0rd&db=0", "unix:///run/redis.sock?password=***&db=0"),
        ("redis://u:pw0rd@h:6379/0?PASSWORD=pw0rd", "redis://u:***@h:6379/0?PASSWORD=***"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_redis_passwords_are_masked(url, shown):
    assert mask_url(url) == shown


def test_pcl_config_prints_no_secret():
    url = "redis://user:pw0rd-in-userinfo@h:6379/0?password=pw0rd-in-query"
    out = subprocess.run([sys.executable, "-m", "entrypoints.cli", "config", "configs/tiny.yaml",
                          f"control.token={GOOD}", f"redis.url={url}"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert GOOD not in out.stdout and "pw0rd" not in out.stdout
    assert "token: '***'" in out.stdout and "user:***@h:6379" in out.stdout
    cfg = load_config(None, [f"control.token={GOOD}", f"redis.url={url}"])
    run_dir_copy = dump_config(redacted(cfg, token_mask=None))  # what a run directory's config.yaml holds
    assert GOOD not in run_dir_copy and "pw0rd" not in run_dir_copy and "token: null" in run_dir_copy
