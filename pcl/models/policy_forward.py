"""What the learners run in place of a Hugging Face model's own forward: per-layer activation checkpointing and
the policy's token log-probabilities from its final hidden states, never a [B, T, V] logits tensor.

    layers = decoder_layers(model)                       # the classes named by model._no_split_modules
    compile_layers(layers)                               # each layer's own computation compiled (torch.compile)
    checkpoint_layers(layers)                            # each layer recomputed in the backward pass
    install_logprob_forward(model, chunk_tokens=1024)    # model(input_ids, attention_mask, response_mask) -> [N]

Both replace `forward` on the instance (a bound method, so copies made with copy.deepcopy stay bound to
themselves), not `__call__`: module hooks (FSDP2's all-gather before a layer's or the root's forward, its
reduce-scatter after their backward) run as before, around the checkpointed or chunked computation. With FSDP2
the root module (embeddings, final norm, LM head; tied embeddings and head stay one parameter) is gathered for
the whole of the root's forward, so the chunked head runs on the gathered head.
"""

from __future__ import annotations

import types

import torch

from pcl.rl import head_token_logprobs


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a Hugging Face model: its modules whose class `_no_split_modules` names, or a
    subclass of it (FSDP2's fully_shard makes each sharded module an FSDP<class>)."""
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if any(c.__name__ in layer_classes for c in type(m).__mro__)]
    if not layers:
        raise ValueError(f"model {type(model).__name__}: no decoder layers found "
                         f"(looked for {sorted(layer_classes)})")
    return layers


def _compiled_forward(self, *args, **kwargs):
    return self._pcl_compiled_forward(self, *args, **kwargs)


def compile_layers(layers: list[torch.nn.Module]) -> None:
    """Compile each layer's own forward with torch.compile (dynamic shapes: micro-batches packed by a token budget
    change shape from pass to pass). The module's hooks stay outside the compiled code (FSDP2 gathers and
    reduce-scatters around it as in eager mode) and parameter names do not change (no `_orig_mod` wrapper);
    the norms, rotary embedding and gated activation, which run as separate memory-bound kernels in eager mode,
    are fused. Layers of one class share their compiled code. Apply before `checkpoint_layers`, which then
    recomputes the compiled forward."""
    compiled: dict[type, object] = {}
    for layer in layers:
        cls = type(layer)
        if cls not in compiled:
            compiled[cls] = torch.compile(cls.forward, dynamic=True)
        layer._pcl_compiled_forward = compiled[cls]
        layer.forward = types.MethodType(_compiled_forward, layer)


def _checkpointed_forward(self, *args, **kwargs):
    forward = getattr(self, "_pcl_compiled_forward", None) or type(self).forward
    if not torch.is_grad_enabled():  # scoring, inference: nothing to recompute
        return forward(self, *args, **kwargs)
    from torch.utils.checkpoint import checkpoint

    # Non-reentrant: keeps only the layer's inputs; the layer runs again when backward reaches it.
    return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)


def checkpoint_layers(layers: list[torch.nn.Module]) -> None:
    """Recompute each layer's activations in the backward pass (whenever grad is enabled) instead of storing
    them: a layer keeps only its input. Idempotent."""
    for layer in layers:
        layer.forward = types.MethodType(_checkpointed_forward, layer)


def _logprob_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     response_mask: torch.Tensor) -> torch.Tensor:
    """log pi(token) of every response token, flat in row-major order of `response_mask` ([B, T-1])."""
    hidden = self.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                use_cache=False).last_hidden_state  # [B, T, H]
    picked = hidden[:, :-1][response_mask]  # [N, H]: only positions that score a response token
    targets = input_ids[:, 1:][response_mask]  # [N]
    return head_token_logprobs(picked, self.get_output_embeddings().weight, targets, self._logprob_chunk_tokens)


def install_logprob_forward(model: torch.nn.Module, chunk_tokens: int = 1024) -> None:
    """Make `model(input_ids=, attention_mask=, response_mask=)` return the flat [N] log-probabilities of the
    response tokens (`pcl.rl.head_token_logprobs`, `chunk_tokens` positions of logits at a time)."""
    head = model.get_output_embeddings()
    config = getattr(model, "config", None)
    if head is None or getattr(head, "bias", None) is not None or getattr(config, "final_logit_softcapping", None):
        raise ValueError(f"model {type(model).__name__}: the chunked log-probabilities need a bias-free linear "
                         "LM head without logit soft-capping")
    model._logprob_chunk_tokens = chunk_tokens
    model.forward = types.MethodType(_logprob_forward, model)
