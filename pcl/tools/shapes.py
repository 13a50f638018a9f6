"""The shapes of Llama / Qwen-style decoders that `pcl plan` (`pcl.tools.plan`) counts memory with: parameters,
activations per token and layer, the LM head's logits chunk, the KV cache; from a local config.json or the
built-in table of the paper's models.

    shape = model_shape("Qwen/Qwen3-8B-Base")     # or a local model directory
    shape.policy_params, shape.activation_bytes(16384, 2, checkpointing=True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LOGITS_CHUNK = 1024  # positions of logits at a time (pcl.models.learner.PolicyLearner's logits_chunk_tokens)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama / Qwen-style decoder that fix its parameter count and KV cache."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool  # input embeddings shared with the LM head
    qk_norm: bool  # Qwen3: an RMSNorm over each head's queries and keys
    source: str = ""

    @property
    def layer_params(self) -> int:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)  # q, k, v, o
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attention + 3 * self.hidden * self.intermediate + norms  # SwiGLU: gate, up, down

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def policy_params(self) -> int:
        head = 0 if self.tied else self.embedding_params
        return self.embedding_params + self.layers * self.layer_params + self.hidden + head

    @property
    def value_params(self) -> int:
        """V: the backbone without the LM head, plus the scalar head (hidden + 1)."""
        return self.embedding_params + self.layers * self.layer_params + self.hidden + self.hidden + 1

    def layer_activation_bytes(self, dtype_bytes: int) -> int:
        """Bytes one token's pass through one layer leaves for backward without checkpointing: the norms' inputs
        and outputs (their float32 copies too), q/k/v before and after norm and rotary, attention's inputs and
        output, the SwiGLU's four intermediate-width tensors."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (dtype_bytes * (4 * self.hidden + 5 * q + 4 * kv + 4 * self.intermediate)
                + 4 * (2 * self.hidden + q + kv))

    def activation_bytes(self, tokens: int, dtype_bytes: int, checkpointing: bool) -> int:
        """A micro-batch's activations over all layers, plus the final hidden states and their gradient."""
        head = 2 * 4 * tokens * self.hidden
        if checkpointing:  # each layer's input, and one layer's activations while it is recomputed
            return (self.layers * tokens * self.hidden * dtype_bytes
                    + tokens * self.layer_activation_bytes(dtype_bytes) + head)
        return self.layers * tokens * self.layer_activation_bytes(dtype_bytes) + head

    def logits_bytes(self, dtype_bytes: int) -> int:
        """The LM head run in chunks: one chunk's float32 logits, their softmax / gradient and compute-dtype copies,
        and (below float32) the float32 accumulator of the head's gradient."""
        chunk = LOGITS_CHUNK * self.vocab * (8 + 2 * dtype_bytes)
        return chunk + (4 * self.vocab * self.hidden if dtype_bytes < 4 else 0)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def _hub(name: str) -> str:
    return f"the config.json of huggingface.co/{name}"


# The paper's models, for presets whose weights are not on this machine: the fields of each model's
# config.json on the Hugging Face Hub. The counts they give (policy_params) match the model cards: Qwen3-1.7B
# 1.7B (1.4B without embeddings), Qwen3-4B 4.0B (3.6B), Qwen3-8B 8.2B (6.95B), Llama-3.2-3B 3.21B.
KNOWN_MODELS = {
    "Qwen/Qwen3-1.7B-Base": ModelShape(151936, 2048, 28, 6144, 16, 8, 128, True, True, _hub("Qwen/Qwen3-1.7B-Base")),
    "Qwen/Qwen3-4B-Base": ModelShape(151936, 2560, 36, 9728, 32, 8, 128, True, True, _hub("Qwen/Qwen3-4B-Base")),
    "Qwen/Qwen3-8B-Base": ModelShape(151936, 4096, 36, 12288, 32, 8, 128, False, True, _hub("Qwen/Qwen3-8B-Base")),
    "meta-llama/Llama-3.2-3B-Instruct": ModelShape(128256, 3072, 28, 8192, 24, 8, 128, True, False,
                                                   _hub("meta-llama/Llama-3.2-3B-Instruct")),
}


class PlanError(ValueError):
    """A model whose shape the plan cannot know."""


def model_shape(path: str) -> ModelShape:
    """The shape of `path`: its config.json when it is a local directory, else the built-in table."""
    config_file = Path(path) / "config.json"
    if config_file.is_file():
        raw = json.loads(config_file.read_text())
        raw = raw.get("text_config", raw)
        heads = raw["num_attention_heads"]
        return ModelShape(raw["vocab_size"], raw["hidden_size"], raw["num_hidden_layers"], raw["intermediate_size"],
                          heads, raw.get("num_key_value_heads") or heads,
                          raw.get("head_dim") or raw["hidden_size"] // heads, raw.get("tie_word_embeddings", True),
                          raw.get("model_type") == "qwen3", str(config_file))
    if path in KNOWN_MODELS:
        return KNOWN_MODELS[path]
    raise PlanError(f"model {path!r}: not a local directory with a config.json, nor one of the known models "
                    f"{sorted(KNOWN_MODELS)}")
