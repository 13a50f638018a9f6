"""The config tree: YAML loading, dotted overrides, and errors that name the key, the file and the range."""

from pathlib import Path

import pytest

from pcl.config import Config, ConfigError, PCLSelection, load_config, parse_override

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_overrides_apply_and_parse_types(tmp_path):
    cfg = load_config(write(tmp_path, "selection: {type: pcl, tau: 0.5, k: 4}\n"),
                      ["selection.tau=0.4", "run.steps=7", "redis.url=null", "optimizer.grad_clip=null"])
    assert isinstance(cfg.selection, PCLSelection)
    assert cfg.selection.tau == 0.4 and cfg.selection.k == 4
    assert cfg.run.steps == 7 and cfg.redis.url is None and cfg.optimizer.grad_clip is None


def test_switching_strategy_on_the_command_line_starts_from_its_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "selection: {type: pcl, tau: 0.3}\n"),
                      ["selection.type=greso", "selection.p_easy=0.2"])
    assert cfg.selection.type == "greso" and cfg.selection.p_easy == 0.2 and cfg.selection.p_hard == 0.5


def test_naming_the_files_own_strategy_keeps_its_settings(tmp_path):
    cfg = load_config(write(tmp_path, "selection: {type: pcl, tau: 0.3, k: 2}\n"), ["selection.type=pcl"])
    assert cfg.selection.type == "pcl" and cfg.selection.tau == 0.3 and cfg.selection.k == 2


def test_unknown_key_names_the_key_and_the_file(tmp_path):
    path = write(tmp_path, "rollout:\n  temprature: 1.0\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert "rollout.temprature" in str(exc.value) and str(path) in str(exc.value)


def test_unknown_key_inside_a_strategy(tmp_path):
    with pytest.raises(ConfigError, match=r"selection\.bogus"):
        load_config(write(tmp_path, "selection: {type: uniform, bogus: 1}\n"))


def test_out_of_range_value_names_field_and_range(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "selection: {type: pcl, tau: 1.5}\n"))
    assert "selection.tau" in str(exc.value) and "<= 1" in str(exc.value)
    with pytest.raises(ConfigError, match=r"run\.m.*>= 1"):
        load_config(write(tmp_path, "{}\n"), ["run.m=0"])


@pytest.mark.parametrize("strategy", ["uniform", "pcl", "prefilter", "dynamic_sampling", "speed", "greso", "probe"])
def test_a_bad_selection_setting_is_named_without_the_strategy_tag(tmp_path, strategy):
    """Every strategy's bad setting reads `selection.<key>`, as the user wrote it (not `selection.<type>.<key>`)."""
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "{}\n"), [f"selection.type={strategy}", "selection.bogus=1"])
    assert "unknown key 'selection.bogus'" in str(exc.value), str(exc.value)


def test_unknown_strategy_lists_the_allowed_ones(tmp_path):
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        load_config(write(tmp_path, "selection: {type: oracle}\n"))


def test_prefilter_bounds_must_be_ordered(tmp_path):
    with pytest.raises(ConfigError, match="p_low"):
        load_config(write(tmp_path, "selection: {type: prefilter, p_low: 0.8, p_high: 0.2}\n"))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "run: [unclosed\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_override_syntax():
    assert parse_override("a.b=1") == (["a", "b"], 1)
    assert parse_override("a=x y") == (["a"], "x y")
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("selection.tau")
    with pytest.raises(ConfigError, match="empty key"):
        parse_override("a..b=1")


# -- environment fallbacks: command line > YAML layers > environment (keys left unset) > defaults ---------------


def test_the_environment_fills_only_the_keys_the_config_leaves_unset(tmp_path, monkeypatch):
    from pcl.config import ENV_FALLBACKS

    env = {"REDIS_URL": "redis://env-host:6379/0", "PCL_DATA_ROOT": "/env/data",
           "PCL_API_TOKEN": "env-token-0123456789abcdef0123456789", "MLFLOW_TRACKING_URI": "http://env-mlflow"}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert set(ENV_FALLBACKS.values()) == set(env)
    cfg = load_config(None)  # defaults only: every key from the environment
    assert (cfg.redis.url, cfg.data.root, cfg.control.token, cfg.logging.mlflow_tracking_uri) == tuple(env.values())
    base = tmp_path / "base.yaml"
    base.write_text("redis: {url: 'redis://yaml-host:6379/0'}\ndata: {root: /yaml/data}\n")
    cfg = load_config(base)  # the YAML wins over the environment; keys it leaves unset still fall back
    assert (cfg.redis.url, cfg.data.root) == ("redis://yaml-host:6379/0", "/yaml/data")
    assert cfg.logging.mlflow_tracking_uri == "http://env-mlflow"
    layer = tmp_path / "layer.yaml"
    layer.write_text("data: {root: /layer/data}\n")
    cfg = load_config([base, layer], ["redis.url=redis://cli-host:6379/0"])  # command line > later layer > YAML
    assert (cfg.redis.url, cfg.data.root) == ("redis://cli-host:6379/0", "/layer/data")
    for var in env:
        monkeypatch.delenv(var)
    cfg = load_config(None)  # nothing set anywhere: the defaults
    assert (cfg.redis.url, cfg.data.root, cfg.control.token, cfg.logging.mlflow_tracking_uri) == (None,) * 4


def test_an_empty_variable_is_unset_and_a_weak_token_is_named_not_shown(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "")
    assert load_config(None).redis.url is None
    monkeypatch.setenv("PCL_API_TOKEN", "short-token")
    with pytest.raises(ConfigError, match="PCL_API_TOKEN") as info:
        load_config(None)
    assert "short-token" not in str(info.value)
    strong = "a-strong-token-0123456789abcdef01234"
    assert load_config(None, [f"control.token={strong}"]).control.token == strong  # set: the variable is not read


def test_the_environment_is_read_only_by_the_config_loader():
    """REDIS_URL, PCL_DATA_ROOT, PCL_API_TOKEN and MLFLOW_TRACKING_URI are read in pcl/config.py and nowhere else."""
    import re

    root = Path(__file__).resolve().parents[2]
    read = re.compile(r"environ(?:\.get)?\s*[\(\[]\s*[\"'](REDIS_URL|PCL_DATA_ROOT|PCL_API_TOKEN|MLFLOW_TRACKING_URI)")
    readers = sorted(str(p.relative_to(root)) for top in ("pcl", "services", "actors", "entrypoints", "bench")
                     for p in (root / top).rglob("*.py") if read.search(p.read_text()))
    assert readers == [], f"read where the value is used, not through the config loader: {readers}"
