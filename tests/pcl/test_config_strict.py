"""The config is as strict as the API: no value changes type on its way in (a bool is not a count, a quoted number is
not a number), URLs are checked by scheme, environment fallbacks are validated like file values, a config that
cannot learn (run.n = 1) is refused; and every shipped config, and the config a run writes into its directory,
still loads and reads back equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pcl.config import Config, ConfigError, dump_config, load_config, redacted

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


# -- strict types: each of these was silently converted before -------------------------------------------------


@pytest.mark.parametrize("text, key", [
    ("run: {m: true}\n", "run.m"),                                # a bool is not a count (was 1)
    ("run: {m: '64'}\n", "run.m"),                                # a quoted number is a string (was 64)
    ("run: {steps: 10.0}\n", "run.steps"),                        # a float is not a count (was 10)
    ("optimizer: {lr: '0.1'}\n", "optimizer.lr"),                 # a string is not a float (was 0.1)
    ("selection: {type: pcl, tau: '0.4'}\n", "selection.tau"),    # inside a strategy's section too
    ("rollout: {deterministic: 'true'}\n", "rollout.deterministic"),  # a string is not a bool (was True)
    ("redis: {appendonly: 0}\n", "redis.appendonly"),             # an int is not a bool (was False)
    ("control: {enabled: 'yes'}\n", "control.enabled"),                # a string is not a bool (was True)
    ("learner: {resources: {accel: '1'}}\n", "learner.resources.accel"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_key_and_the_file(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"'{key}'" in str(info.value) and str(path) in str(info.value), str(info.value)


def test_a_quoted_number_on_the_command_line_is_a_string_and_refused():
    with pytest.raises(ConfigError, match=r"command line: 'run\.m': Input should be a valid integer \(got '64'\)"):
        load_config(None, ["run.m='64'"])


def test_command_line_values_are_read_as_yaml_scalars_so_they_keep_working():
    cfg = load_config(CONFIGS / "tiny.yaml", ["run.m=64", "selection.tau=0.4", "logging.backends=[console,jsonl]",
                                              "optimizer.lr=1e-6", "value.lr=2E-5", "run.eval_every_s=30",
                                              "control.enabled=false", "rollout.temperature=1"])
    assert (cfg.run.m, cfg.selection.tau, cfg.logging.backends) == (64, 0.4, ["console", "jsonl"])
    assert (cfg.optimizer.lr, cfg.value.lr, cfg.run.eval_every_s) == (1e-6, 2e-5, 30.0)
    assert cfg.control.enabled is False and cfg.rollout.temperature == 1.0


def test_exponent_floats_without_a_dot_are_numbers_in_files_too(tmp_path):
    """YAML 1.1 (PyYAML) reads `8e-06` as a string; the presets write the learning rate that way."""
    cfg = load_config(write(tmp_path, "optimizer: {lr: 8e-06, eps: 1E-8}\nvalue: {lr: 1e-6}\n"))
    assert (cfg.optimizer.lr, cfg.optimizer.eps, cfg.value.lr) == (8e-6, 1e-8, 1e-6)
    assert load_config(None, ["run.name=1e5x", "data.revision='1e5'"]).data.revision == "1e5"  # whole scalars only


# -- URLs, checked by scheme; a password never shown --------------------------------------------------------------


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "rediss://user:pw@cache.example.org:6380",
                                 "redis://:pw@10.0.0.2", "unix:///tmp/redis.sock", "unix:///tmp/r.sock?db=2",
                                 "redis://:***@host:6379/0"])  # the last: a run directory's copy, password masked
def test_redis_urls_of_the_three_schemes_load(url):
    assert load_config(None, [f"redis.url={url}"]).redis.url == url


@pytest.mark.parametrize("url, why", [
    ("http://localhost:6379", "scheme"), ("localhost:6379", "scheme"), ("127.0.0.1", "scheme"),
    ("redis://:s3cretpw@host:port/0", "port"), ("redis://:s3cretpw@host:6379/zero", "database"),
    ("redis://:s3cretpw@:6379/0", "host"), ("unix://", "path"),
])
def test_a_bad_redis_url_is_named_with_the_allowed_form_and_no_password(url, why):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"redis.url={url}"])
    message = str(info.value)
    assert "'redis.url'" in message and why in message and "redis://" in message, message
    assert "s3cretpw" not in message


@pytest.mark.parametrize("uri", ["http://mlflow.example.org:5000", "https://u:pw@mlflow.example.org",
                                 "file:///tmp/mlruns", "/tmp/mlruns", "./mlruns", "sqlite:///tmp/mlflow.db",
                                 "postgresql://u:pw@db/mlflow", "postgresql+psycopg2://u:pw@db:5432/mlflow",
                                 "mysql+pymysql://u:pw@db/mlflow", "databricks", "databricks://profile",
                                 "databricks-uc", "uc:http://localhost:8080"])
def test_mlflow_tracking_uris_of_every_store_mlflow_has_load(uri):
    assert load_config(None, [f"logging.mlflow_tracking_uri={uri}"]).logging.mlflow_tracking_uri == uri


@pytest.mark.parametrize("uri", ["localhost:5000", "htp://mlflow:5000", "http://", "redis://host:6379",
                                 "postgresql://u:s3cretpw@db:port/mlflow"])
def test_a_bad_mlflow_tracking_uri_is_named_and_its_password_masked(uri):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"logging.mlflow_tracking_uri={uri}"])
    assert "'logging.mlflow_tracking_uri'" in str(info.value) and "s3cretpw" not in str(info.value), str(info.value)


# -- environment fallbacks are validated like the file's values ---------------------------------------------------


@pytest.mark.parametrize("var, value", [("REDIS_URL", "http://:s3cretpw@host:6379"),
                                        ("REDIS_URL", "redis://:s3cretpw@host:port"),
                                        ("MLFLOW_TRACKING_URI", "localhost:5000")])
def test_a_bad_environment_fallback_is_named_by_its_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "tiny.yaml")
    assert var in str(info.value) and "s3cretpw" not in str(info.value), str(info.value)
    monkeypatch.setenv(var, "redis://ok:6379" if var == "REDIS_URL" else "http://ok:5000")
    cfg = load_config(CONFIGS / "tiny.yaml")  # a good one is taken, and the config is still a validated one
    assert isinstance(cfg, Config) and Config.model_validate(cfg.model_dump()) == cfg


# -- a config that cannot learn ------------------------------------------------------------------------------------


def test_one_generation_per_prompt_is_refused_naming_run_n(tmp_path):
    for source in (lambda: load_config(write(tmp_path, "run: {n: 1}\n")), lambda: load_config(None, ["run.n=1"])):
        with pytest.raises(ConfigError) as info:
            source()
        assert "'run.n'" in str(info.value) and "advantage" in str(info.value), str(info.value)
    assert load_config(None, ["run.n=2"]).run.n == 2


# -- every shipped config loads, and a run's own copy of it reads back equal --------------------------------------


def shipped_configs() -> dict[str, Config]:
    """Every config under configs/, layered as the docs use them: each preset alone and under each baseline, the
    tiny, tiny-carry, chaos and soak configs alone, and each experiment's every arm (its base, overrides and the arm's)."""
    from entrypoints.experiment import load_experiment, run_config

    presets = sorted((CONFIGS / "presets").glob("*.yaml"))
    baselines = sorted((CONFIGS / "baselines").glob("*.yaml"))
    configs = {path.stem: load_config(path) for path in (CONFIGS / "tiny.yaml", CONFIGS / "tiny-carry.yaml",
                                                         CONFIGS / "chaos.yaml", CONFIGS / "soak.yaml", *presets)}
    configs |= {f"{p.stem}+{b.stem}": load_config([p, b]) for p in presets for b in baselines}
    for path in sorted((CONFIGS / "experiments").glob("*.yaml")):
        exp = load_experiment(path)
        configs |= {f"{path.stem}:{arm}": run_config(exp, arm, exp.seeds[0]) for arm in exp.strategies}
    listed = {p.relative_to(CONFIGS) for p in CONFIGS.rglob("*.yaml")}
    assert listed == {Path(n) for n in ("tiny.yaml", "tiny-carry.yaml", "chaos.yaml", "soak.yaml")} | {
        p.relative_to(CONFIGS) for p in (*presets, *baselines, *(CONFIGS / "experiments").glob("*.yaml"))}, listed
    return configs


def test_every_shipped_config_loads_and_reads_back_equal_from_its_run_directory_copy(tmp_path):
    """What a run writes (RUN_DIR/config.yaml, each checkpoint's: dump_config, JSON types in YAML), what `pcl eval
    RUN_DIR/config.yaml` and a resumed run's checks read back; the JSON form trackers log; and the dict the
    coordinator actor re-validates (cfg.model_dump())."""
    configs = shipped_configs()
    assert len(configs) >= 3 + 8 + 8 * 5 + 8, sorted(configs)
    for name, cfg in configs.items():
        written = redacted(cfg, token_mask=None)  # what a run directory holds
        path = tmp_path / f"{name.replace(':', '-')}.yaml"
        path.write_text(dump_config(written))
        assert load_config(path) == written, name
        assert Config.model_validate(json.loads(json.dumps(cfg.model_dump(mode="json")))) == cfg, name
        assert Config.model_validate(cfg.model_dump()) == cfg, name
        assert Config.model_validate_json(cfg.model_dump_json()) == cfg, name


def test_a_secret_bearing_config_reads_back_from_its_run_directory_copy_masked(tmp_path):
    token = "a-strong-token-0123456789abcdef01234"
    cfg = load_config(CONFIGS / "tiny.yaml", ["redis.url=redis://:s3cretpw@host:6379/0", f"control.token={token}",
                                              "logging.mlflow_tracking_uri=postgresql://u:s3cretpw@db/mlflow"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(redacted(cfg, token_mask=None)))
    assert "s3cretpw" not in path.read_text() and token not in path.read_text()
    back = load_config(path)
    assert (back.redis.url, back.control.token) == ("redis://:***@host:6379/0", None)
    assert back.logging.mlflow_tracking_uri == "postgresql://u:***@db/mlflow"
    assert yaml.safe_load(path.read_text())["run"] == cfg.model_dump(mode="json")["run"]
