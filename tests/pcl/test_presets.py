"""Every paper preset and every preset + baseline combination loads and validates, with the paper's numbers; the
reproduction guide's `pcl train` commands (docs/reproduce.md) resolve to each preset and method once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pcl.config import load_config

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs" / "presets").glob("*.yaml"))
BASELINES = sorted((REPO / "configs" / "baselines").glob("*.yaml"))
MODELS = {"qwen3-1.7b-base": "Qwen/Qwen3-1.7B-Base", "qwen3-4b-base": "Qwen/Qwen3-4B-Base",
          "qwen3-8b-base": "Qwen/Qwen3-8B-Base", "llama3.2-3b-instruct": "meta-llama/Llama-3.2-3B-Instruct"}


def test_all_eight_presets_and_five_baselines_are_there():
    assert len(PRESETS) == 8 and {p.stem.rsplit("-", 1)[0] for p in PRESETS} == set(MODELS)
    assert {p.stem for p in BASELINES} == {"uniform", "prefilter", "dynamic_sampling", "speed", "greso"}


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_has_the_papers_settings(path):
    cfg = load_config(path)
    model, dataset = path.stem.rsplit("-", 1)
    assert cfg.model.path == MODELS[model] and cfg.model.dtype == "bfloat16"
    assert (cfg.run.m, cfg.run.n) == (512, 16)
    assert (cfg.selection.type, cfg.selection.tau, cfg.selection.k) == ("pcl", 0.5, 4)
    assert cfg.value.lr == 1e-6 and cfg.value.path is None  # V: the policy's size and backbone
    assert cfg.optimizer.lr == {"math": 8e-6, "deepscaler": 4e-6}[dataset]
    assert cfg.data.source == dataset
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens == 4096
    assert cfg.data.template == ("chat" if "instruct" in model else "qwen_base")
    assert cfg.rollout.engine == "vllm" and cfg.learner.backend == "nccl" and cfg.learner.num_gpus_per_rank == 1
    # The learner at 4,096-token sequences: a token budget, each layer recomputed and compiled (bench/gpu_check.py).
    assert cfg.learner.max_tokens_per_micro_batch and cfg.learner.activation_checkpointing and cfg.learner.compile
    ev = cfg.evaluation
    assert (ev.temperature, ev.top_p) == (0.6, 0.95)
    if dataset == "math":  # the paper's MATH protocol: MATH500 every 8 steps, the best checkpoint by it, top-k 20
        assert (ev.suite, ev.every, ev.best_by, ev.top_k) == (["math500"], 8, "math500", 20)
    else:  # DeepScaleR: the six-benchmark average picks the best checkpoint, top-k disabled
        assert ev.suite == ["math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench"]
        assert (ev.every, ev.best_by, ev.top_k) == (20, "average", -1)
    assert ev.keep_best
    # The wall-clock budget: 2 days, 3 for the largest model on the larger training set.
    days = 3 if (model, dataset) == ("qwen3-8b-base", "deepscaler") else 2
    assert cfg.run.time_budget_s == days * 24 * 3600
    assert cfg.value.score_dtype == "auto" and cfg.value.num_ranks == {"qwen3-4b-base": 2, "qwen3-8b-base": 4}.get(model, 1)


def test_best_by_must_name_average_or_a_benchmark_of_the_suite(tmp_path):
    from pcl.config import ConfigError
    from pcl.benchmarks import best_score

    preset = REPO / "configs" / "presets" / "qwen3-1.7b-base-math.yaml"
    with pytest.raises(ConfigError, match="best_by"):
        load_config(preset, ["evaluation.best_by=aime24"])
    cfg = load_config(preset, ["evaluation.suite=[math500,aime24]", "evaluation.best_by=aime24", "evaluation.top_k=-1"])
    assert (cfg.evaluation.best_by, cfg.evaluation.top_k) == ("aime24", -1)
    record = {"suite_math500": 0.7, "suite_aime24": 0.1, "suite_average": 0.4}
    assert (best_score(record, "average"), best_score(record, "math500"), best_score(record, "aime24")) == (0.4, 0.7, 0.1)
    with pytest.raises(KeyError, match="minerva"):
        best_score(record, "minerva")


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda p: p.stem)
def test_each_baseline_over_a_preset_replaces_only_the_selection(baseline):
    preset = REPO / "configs" / "presets" / "qwen3-4b-base-deepscaler.yaml"
    base, combined = load_config(preset), load_config([preset, baseline])
    assert combined.selection.type == baseline.stem
    assert combined.model_dump(exclude={"selection"}) == base.model_dump(exclude={"selection"})
    if baseline.stem == "prefilter":
        assert (combined.selection.n_pre, combined.selection.p_low, combined.selection.p_high) == (16, 0.0, 1.0)
    if baseline.stem == "speed":
        assert (combined.selection.k, combined.selection.n_init, combined.selection.carry_over) == (2, 4, True)
    if baseline.stem == "dynamic_sampling":  # Algorithm 3: k=2, until m informative prompts (round-limit safeguard)
        assert (combined.selection.k, combined.selection.at_round_limit) == (2, "shrink")
    if baseline.stem == "greso":  # a first round of 768 prompts at m=512
        assert combined.selection.k * combined.run.m == 768


def test_layering_keeps_a_same_strategy_section_and_cli_takes_several_files(tmp_path):
    extra = tmp_path / "tau.yaml"
    extra.write_text("selection:\n  type: pcl\n  tau: 0.3\n")
    cfg = load_config([REPO / "configs" / "presets" / "qwen3-4b-base-math.yaml", extra], ["run.steps=7"])
    assert (cfg.selection.tau, cfg.selection.k, cfg.run.steps) == (0.3, 4, 7)
    run = subprocess.run([sys.executable, "-m", "entrypoints.cli", "config", "configs/presets/qwen3-8b-base-math.yaml",
                          "configs/baselines/speed.yaml", "run.steps=9"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "type: speed" in run.stdout and "steps: 9" in run.stdout and "Qwen/Qwen3-8B-Base" in run.stdout


def test_pcl_train_takes_a_preset_and_a_baseline():
    from entrypoints.cli import _config_files, build_parser

    args = build_parser().parse_args(["train", "configs/presets/qwen3-4b-base-math.yaml",
                                      "configs/baselines/greso.yaml", "run.steps=5"])
    files, overrides = _config_files(args)
    assert files == ["configs/presets/qwen3-4b-base-math.yaml", "configs/baselines/greso.yaml"]
    assert overrides == ["run.steps=5"]
    cfg = load_config([REPO / f for f in files], overrides)
    assert cfg.selection.type == "greso" and not hasattr(cfg.selection, "tau")  # replaced wholesale
    assert (cfg.selection.p_easy, cfg.selection.p_hard, cfg.selection.delta_p) == (0.5, 0.5, 0.01)
    assert (cfg.model.path, cfg.optimizer.lr, cfg.run.steps) == ("Qwen/Qwen3-4B-Base", 8e-6, 5)


def test_a_selection_layer_without_a_type_refines_the_strategy_and_a_bad_one_is_a_config_error(tmp_path):
    from pcl.config import ConfigError

    preset = REPO / "configs" / "presets" / "qwen3-1.7b-base-deepscaler.yaml"
    untyped = tmp_path / "k.yaml"
    untyped.write_text("selection:\n  k: 8\n")
    cfg = load_config([preset, untyped])
    assert (cfg.selection.type, cfg.selection.tau, cfg.selection.k) == ("pcl", 0.5, 8)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("selection: greso\n")
    with pytest.raises(ConfigError, match="scalar.yaml"):
        load_config([preset, scalar])


def _reproduce_train_commands() -> list[list[str]]:
    """The `pcl train` lines of docs/reproduce.md's shell blocks, with their P= and B= variables expanded."""
    import re
    import shlex

    text = (REPO / "docs" / "reproduce.md").read_text()
    commands, env = [], {}
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            if m := re.fullmatch(r'([PB])=("?)(.*)\2', line):
                env[m[1]] = m[3]
            elif line.startswith("pcl train "):
                words = shlex.split(re.sub(r"\$([PB])\b", lambda v: env[v[1]], line))
                commands.append(words[2:])
    return commands


def test_every_table_1_command_in_the_reproduction_guide_resolves_to_its_arm_and_budget():
    from entrypoints.cli import _config_files, build_parser

    arms = {"uniform": "grpo", "prefilter": "prefilter", "dynamic_sampling": "ds", "speed": "speed",
            "greso": "greso", "pcl": "pcl"}
    seen = set()
    for words in _reproduce_train_commands():
        files, overrides = _config_files(build_parser().parse_args(["train", *words]))
        cfg = load_config([REPO / f for f in files], overrides)
        preset = Path(files[0]).stem
        assert cfg.run.name == f"{preset}-{arms[cfg.selection.type]}", words
        assert cfg.run.steps == 100000 and cfg.run.seed == 0
        assert cfg.run.time_budget_s == (259200 if preset == "qwen3-8b-base-deepscaler" else 172800), words
        seen.add((preset, cfg.selection.type))
    assert seen == {(p.stem, arm) for p in PRESETS for arm in arms}  # 8 presets x 6 methods, each once
    assert len(_reproduce_train_commands()) == len(seen) == 48


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_rollout_fleet_settings(path):
    """Unseeded sampling (seeded requests are sampled one by one in vLLM), vLLM with its GPUs to itself
    (gpu_memory_utilization 0.85-0.9), max_in_flight one request chunk (m / num_workers: every worker gets its
    share of a step), and the context vLLM is started with: the longest prompt and response asked for."""
    from pcl.engines import max_model_len

    cfg = load_config(path)
    r = cfg.rollout
    assert r.deterministic is False
    assert 0.85 <= r.gpu_memory_utilization <= 0.9
    assert r.max_in_flight == cfg.run.m // r.num_workers
    assert max_model_len(cfg) == cfg.data.max_prompt_tokens + max(r.max_new_tokens, cfg.evaluation.max_new_tokens
                                                                  or r.max_new_tokens)
