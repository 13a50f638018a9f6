"""`pcl plan`: parameter counts, memory per GPU, every preset fits the cluster its comment names, and a cluster
too small is refused naming the shortfall."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pcl.config import load_config
from pcl.tools.plan import GB, KNOWN_MODELS, PlanError, model_shape, plan_run

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs" / "presets").glob("*.yaml"))
SIZED_FOR = re.compile(r"Sized for (\d+) nodes? of (\d+) (\d+) GB GPUs")


def _pcl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "entrypoints.cli", *args], cwd=REPO, capture_output=True, text=True)


@pytest.mark.parametrize("name, total, non_embedding", [
    ("Qwen/Qwen3-1.7B-Base", 1.7, 1.4), ("Qwen/Qwen3-4B-Base", 4.0, 3.6), ("Qwen/Qwen3-8B-Base", 8.2, 6.95),
    ("meta-llama/Llama-3.2-3B-Instruct", 3.21, None)])
def test_built_in_shapes_give_the_model_cards_parameter_counts(name, total, non_embedding):
    shape = KNOWN_MODELS[name]
    assert shape.policy_params / 1e9 == pytest.approx(total, abs=0.03)
    if non_embedding is not None:
        assert shape.layers * shape.layer_params / 1e9 == pytest.approx(non_embedding, abs=0.05)
    # V has the backbone without an LM head: the untied 8B loses its 0.62B-parameter head, the tied ones nothing.
    lm_head = 0 if shape.tied else shape.embedding_params
    assert shape.value_params == shape.policy_params - lm_head + shape.hidden + 1


def test_a_local_config_json_gives_the_models_exact_parameter_count(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from pcl.models.value import ValueModel

    shape = model_shape(str(tiny_model_dir))
    assert shape.source.endswith("config.json")
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.policy_params == sum(p.numel() for p in policy.parameters())
    assert shape.value_params == sum(p.numel() for p in ValueModel.from_pretrained(tiny_model_dir).parameters())
    with pytest.raises(PlanError, match="'no/such-model'"):
        model_shape("no/such-model")


def test_value_memory_is_sixteen_bytes_per_parameter_over_the_ranks_plus_the_scoring_copy():
    preset = REPO / "configs" / "presets" / "qwen3-8b-base-math.yaml"
    params = KNOWN_MODELS["Qwen/Qwen3-8B-Base"].value_params
    one = {r.name: r for r in plan_run(load_config(preset, ["value.num_ranks=1"])).roles}["value model"]
    assert {k: v for k, v in one.parts.items() if k != "activations"} == {
        "weights": 4 * params, "grads": 4 * params, "optimizer": 8 * params,
        "scoring copy": 2 * params}  # bfloat16 copy, nothing gathered on one rank
    assert one.parts["activations"] > 0
    four = {r.name: r for r in plan_run(load_config(preset)).roles}["value model"]
    assert four.parts["optimizer"] == 2 * params and four.parts["scoring copy"] == 2 * params
    assert four.parts["gathered"] > 0 and four.total < one.total / 2
    f32 = {r.name: r for r in plan_run(load_config(preset, ["value.num_ranks=1", "value.score_dtype=float32"])).roles}
    assert "scoring copy" not in f32["value model"].parts  # one float32 rank scores with its trained weights


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_preset_fits_the_cluster_its_comment_names(path):
    cfg = load_config(path)
    nodes, gpus, memory = (int(x) for x in SIZED_FOR.search(path.read_text()).groups())
    assert (cfg.cluster.nodes, cfg.cluster.gpus_per_node, cfg.cluster.gpu_memory_gb) == (nodes, gpus, memory)
    plan = plan_run(cfg)
    assert plan.shortfalls == [], plan.table()
    assert {r.name for r in plan.roles} == {"policy learner", "value model", "rollout (vLLM)"}
    assert all(r.total <= r.budget for r in plan.roles)


def test_pcl_plan_prints_the_table_and_refuses_a_cluster_too_small():
    fits = _pcl("plan", "configs/presets/qwen3-8b-base-math.yaml")
    assert fits.returncode == 0, fits.stderr
    assert "value model" in fits.stdout and "KV cache" in fits.stdout and fits.stdout.rstrip().endswith("fits")
    one_node = _pcl("plan", "configs/presets/qwen3-8b-base-math.yaml", "--nodes", "1")
    assert one_node.returncode == 1
    assert "the run asks for 16 GPUs, the cluster has 8 (1 x 8), short by 8" in one_node.stdout
    unsharded = _pcl("plan", "configs/presets/qwen3-8b-base-math.yaml", "value.num_ranks=1", "learner.num_ranks=7")
    assert unsharded.returncode == 1
    assert re.search(r"V on 1 x 80 GB: needs [\d.]+ GB per GPU, 72.0 GB usable, short by [\d.]+ GB; "
                     r"set value.num_ranks >= \d", unsharded.stdout)
    small = _pcl("plan", "configs/presets/qwen3-4b-base-math.yaml", "--gpu-memory", "24")
    assert small.returncode == 1
    assert re.search(r"V on 2 x 24 GB: needs [\d.]+ GB per GPU, 21.6 GB usable, short by [\d.]+ GB; "
                     r"set value.num_ranks >= \d+", small.stdout)
    assert "policy learner on 2 x 24 GB" in small.stdout


def test_bad_plan_input_is_a_config_error():
    bad = _pcl("plan", "configs/presets/qwen3-4b-base-math.yaml", "--headroom", "2")
    assert bad.returncode == 2 and "'cluster.headroom' = 2.0 is out of range" in bad.stderr
    unknown = _pcl("plan", "configs/presets/qwen3-4b-base-math.yaml", "model.path=no/such-model")
    assert unknown.returncode == 2 and "'no/such-model'" in unknown.stderr


def test_a_cpu_config_is_not_checked():
    plan = plan_run(load_config(REPO / "configs" / "tiny.yaml"))
    assert plan.shortfalls == [] and plan.roles == [] and "a CPU run" in plan.table()
    assert GB == 1e9


def test_activations_logits_and_the_token_budget_are_counted():
    preset = REPO / "configs" / "presets" / "qwen3-8b-base-math.yaml"

    def learner(*overrides: str):
        return {r.name: r for r in plan_run(load_config(preset, list(overrides))).roles}["policy learner"]

    base = learner()
    assert base.tokens == 16384 and base.parts["activations"] > 0 and base.parts["logits"] > 0
    shape = KNOWN_MODELS["Qwen/Qwen3-8B-Base"]
    assert base.parts["activations"] == shape.activation_bytes(16384, 2, checkpointing=True)
    off = learner("learner.activation_checkpointing=false")
    assert off.parts["activations"] > 10 * base.parts["activations"]  # every layer's activations, not its input
    half = learner("learner.max_tokens_per_micro_batch=8192")
    assert half.tokens == 8192 and half.parts["activations"] == pytest.approx(base.parts["activations"] / 2, rel=0.01)
    # No budget: micro_batch_size sequences of the longest length (1,024 + 3,072).
    assert learner("learner.max_tokens_per_micro_batch=null").tokens == 8 * 4096
    assert base.parts["logits"] == learner("learner.max_tokens_per_micro_batch=8192").parts["logits"]  # per chunk


def test_pcl_plan_names_the_setting_to_change_when_activations_do_not_fit():
    done = _pcl("plan", "configs/presets/qwen3-8b-base-math.yaml", "learner.activation_checkpointing=false",
                "learner.max_tokens_per_micro_batch=32768")
    assert done.returncode == 1
    assert re.search(r"policy learner on 4 x 80 GB: needs [\d.]+ GB per GPU, 72.0 GB usable, short by [\d.]+ GB; "
                     r"set learner.activation_checkpointing: true", done.stdout)
    header = next(line for line in done.stdout.splitlines() if line.startswith("GB per GPU"))
    assert all(column in header for column in ("activations", "logits", "mb tokens"))
    budget = _pcl("plan", "configs/presets/qwen3-8b-base-math.yaml", "learner.max_tokens_per_micro_batch=131072",
                  "learner.micro_batch_size=64")
    assert budget.returncode == 1 and "set learner.max_tokens_per_micro_batch <= " in budget.stdout
