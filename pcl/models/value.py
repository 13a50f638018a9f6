"""The value model V(x): a transformer backbone plus a scalar head predicting a prompt's pass rate.

PCL scores k*m candidate prompts with V every step (algorithm step 2), keeps the m closest to tau, and
then trains V on those m prompts against their measured pass rates (step 8):

    model = ValueModel.from_pretrained(policy_path, dtype="float32", device="cpu")
    trainer = ValueTrainer(model, lr=1e-6, grad_clip=1.0, batch_size=64, score_dtype="auto")
    values = trainer.score(candidate_token_ids)                 # np.ndarray [k*m], each in [0, 1]
    stats = trainer.train_step(selected_token_ids, pass_rates)  # {"loss", "grad_norm", ...}
    model.save_pretrained(run_dir / "value")                    # backbone + head, reloadable

The backbone is whatever `transformers.AutoModel` loads from the path: the base model of a causal LM
(the lm_head is dropped) or an encoder. V reads the last hidden state of the prompt's LAST real token
(prompt only, no response), whatever side the batch is padded on.

V trains in float32. It can score with a copy in another dtype (`score_dtype`: bfloat16 halves the memory
read per candidate, and the k*m candidates are scored every step), refreshed from the trained weights after
every step and every load. Across several processes V is sharded with FSDP2: `pcl.models.value_sharded`.
"""

from __future__ import annotations

import copy
import inspect
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pcl.checkpoint_store import load_tensors
from pcl.engines.base import check_prompts, left_pad, resolve_device, resolve_dtype
from pcl.models.micro_batches import pack_micro_batches
from pcl.models.policy_forward import checkpoint_layers, decoder_layers
from pcl.models.sharding import total_norm
from pcl.rl import value_loss

HEAD_FILE = "value_head.safetensors"


def _hidden_size(config) -> int:
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("hidden_size", "d_model", "dim"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    raise ValueError(f"value backbone config {type(config).__name__}: no hidden_size / d_model / dim field")


class ValueModel(torch.nn.Module):
    """V(x) = sigmoid(w . h_last(x) + b), h_last the backbone's final hidden state at the prompt's last token.

    The head is float32 whatever the backbone's dtype (a bf16 logit near 0 has a step of ~0.004, coarser
    than the differences between candidates that selection ranks) and starts at zero, so every initial
    prediction is exactly 0.5.
    """

    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(_hidden_size(backbone.config), 1, dtype=torch.float32)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        accepted = inspect.signature(backbone.forward).parameters
        # Decoders need positions that skip left padding; encoders with absolute positions do too.
        self._pass_position_ids = "position_ids" in accepted
        self._pass_use_cache = "use_cache" in accepted

    @property
    def vocab_size(self) -> int:
        return self.backbone.get_input_embeddings().num_embeddings

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str | torch.dtype = "float32",
                        device: str | torch.device = "cpu") -> "ValueModel":
        """A backbone from any Hugging Face checkpoint; the trained head too when `path` holds one.

        Train in float32: AdamW steps of the paper's lr (1e-6) are below bf16's resolution and would
        vanish in bf16 weights. bfloat16 suits a scoring-only copy.
        """
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(str(path), dtype=resolve_dtype(dtype))
        model = cls(backbone)
        head_path = Path(path) / HEAD_FILE
        if head_path.is_file():
            from safetensors.torch import load_file

            model.head.load_state_dict(load_file(str(head_path)))
        return model.to(resolve_device(device)).eval()

    def save_pretrained(self, directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Backbone in Hugging Face format plus `value_head.safetensors`; `from_pretrained` reloads both.

        `state_dict`: the full weights to write (names as `self.state_dict()`'s), for a sharded model; the
        live weights when None.
        """
        from safetensors.torch import save_file

        directory = Path(directory)
        if state_dict is None:
            self.backbone.save_pretrained(str(directory))
            head = self.head.state_dict()
        else:
            backbone = {k.removeprefix("backbone."): v for k, v in state_dict.items() if k.startswith("backbone.")}
            self.backbone.save_pretrained(str(directory), state_dict=backbone)
            head = {k.removeprefix("head."): v for k, v in state_dict.items() if k.startswith("head.")}
        save_file({name: t.detach().cpu().contiguous() for name, t in head.items()}, str(directory / HEAD_FILE))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Predicted pass rates.

        Args:
            input_ids: [B, T] prompt token ids, padded on either side.
            attention_mask: [B, T] 1 for prompt tokens, 0 for padding; every row has at least one 1.

        Returns:
            [B] float32 values in [0, 1].
        """
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self._pass_position_ids:
            # Position of each token among the real ones: left padding must not shift the prompt.
            kwargs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]
        if self._pass_use_cache:
            kwargs["use_cache"] = False
        hidden = self.backbone(**kwargs).last_hidden_state  # [B, T, H]
        width = attention_mask.shape[1]
        last = width - 1 - attention_mask.flip(-1).argmax(-1)  # [B] column of the last real token
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        prompt_state = hidden[rows, last].float()  # [B, H]
        # sigmoid last, so the output is a new tensor, not a view (FSDP2 hooks its root's outputs for backward).
        return torch.sigmoid(self.head(prompt_state).squeeze(-1))  # [B]


def resolve_score_dtype(score_dtype: str | None, device: torch.device) -> torch.dtype | None:
    """`value.score_dtype` as a torch dtype: 'auto' is bfloat16 on GPU and float32 on CPU (CPU bf16 matmuls
    are slower than float32 ones on most CPUs, and would move the CPU runs' values); None stays None."""
    if score_dtype is None:
        return None
    if score_dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return resolve_dtype(score_dtype)


def score_copy(model: ValueModel, dtype: torch.dtype) -> ValueModel:
    """An unsharded copy of `model` for scoring: the backbone in `dtype`, the head float32 (see ValueModel).

    Each parameter is cast as it is copied, so building a bfloat16 copy never holds a second float32 model."""
    memo = {}  # deepcopy takes these for the parameters (tied ones stay tied) instead of copying them whole
    for name, parameter in model.named_parameters():
        cast = parameter.detach().to(dtype if name.startswith("backbone.") else torch.float32, copy=True)
        memo[id(parameter)] = torch.nn.Parameter(cast, requires_grad=False)
    return copy.deepcopy(model, memo).eval()


class ValueTrainer:
    """Scores prompts with a ValueModel and trains it with its own AdamW (algorithm steps 2 and 8).

    Dropout stays off in training too (the model is kept in eval mode): the targets are already noisy
    pass-rate estimates, and a deterministic forward makes a step reproducible.

    Args:
        model: the value model (on its device).
        lr: AdamW learning rate (the paper: 1e-6).
        grad_clip: global gradient-norm clip; None disables clipping (the norm is still reported).
        batch_size: prompts per forward pass, in scoring and in training (gradients accumulate).
        weight_decay, betas, eps: AdamW settings.
        score_dtype: None scores with the trained weights themselves; 'float32' / 'bfloat16' / 'float16'
            (or 'auto', see `resolve_score_dtype`) score with a copy in that dtype, refreshed after every
            step and every load (none is made when the backbone already has that dtype).
        max_tokens_per_micro_batch: prompt tokens of one pass, padding included (prompts x the longest), in
            scoring and training, besides `batch_size`; None: `batch_size` prompts a pass.
        activation_checkpointing: recompute each backbone layer in the training backward pass.
    """

    def __init__(self, model: ValueModel, lr: float, grad_clip: float | None = 1.0, batch_size: int = 64,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, score_dtype: str | None = None, max_tokens_per_micro_batch: int | None = None,
                 activation_checkpointing: bool = False) -> None:
        if not lr > 0:
            raise ValueError(f"lr: expected a value > 0, got {lr!r}")
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip: expected None or a value > 0, got {grad_clip!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
        if max_tokens_per_micro_batch is not None and max_tokens_per_micro_batch < 1:
            raise ValueError(f"max_tokens_per_micro_batch: expected None or >= 1, got {max_tokens_per_micro_batch!r}")
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.model = model.eval()
        self.grad_clip = grad_clip
        self.batch_size = batch_size
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps,
                                           weight_decay=weight_decay)
        self.steps = 0
        self.pad_token_id = 0  # any id works: padding is masked out
        dtype = resolve_score_dtype(score_dtype, model.device)
        backbone_dtype = next(model.backbone.parameters()).dtype
        self.scorer = score_copy(model, dtype) if dtype not in (None, backbone_dtype) else None
        if activation_checkpointing:  # after the copy: scoring runs without grad, where layers run plainly anyway
            checkpoint_layers(decoder_layers(model.backbone))

    @property
    def scoring_model(self) -> ValueModel:
        """The model `score` runs: the scoring copy when there is one, else the trained model."""
        return self.model if self.scorer is None else self.scorer

    def refresh_scorer(self) -> None:
        """Copy the trained weights into the scoring copy (cast to its dtypes); nothing without one."""
        if self.scorer is None:
            return
        source = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, target in self.scorer.named_parameters():
                target.copy_(source[name])

    def _batches(self, token_ids_list: Sequence[Sequence[int]]):
        """(indices, input_ids [b, T], attention_mask [b, T]) per pass: prompts longest first, at most
        `batch_size` a pass and at most `max_tokens_per_micro_batch` padded tokens (V does not depend on padding,
        and its loss is a sum over prompts, so the grouping changes neither values nor gradients)."""
        lengths = [len(ids) for ids in token_ids_list]
        budget = self.max_tokens_per_micro_batch
        if budget is not None and lengths and max(lengths) > budget:
            longest = max(lengths)
            raise ValueError(f"prompt {lengths.index(longest)}: {longest} tokens exceed "
                             f"value.max_tokens_per_micro_batch = {budget}; raise it to at least {longest}")
        device = self.model.device
        for indices in pack_micro_batches(lengths, self.batch_size, budget):
            input_ids, attention_mask = left_pad([list(token_ids_list[i]) for i in indices], self.pad_token_id)
            yield indices, input_ids.to(device), attention_mask.to(device)

    def score(self, token_ids_list: Sequence[Sequence[int]]) -> np.ndarray:
        """V(x) for each prompt: float64 array of shape [len(token_ids_list)], values in [0, 1].

        Prompts are batched in order of length, so a batch carries little padding (V does not depend
        on padding), and the values are returned in the input order.
        """
        check_prompts(list(token_ids_list), self.model.vocab_size)
        values = np.zeros(len(token_ids_list), dtype=np.float64)
        model = self.scoring_model
        with torch.inference_mode():
            for indices, input_ids, attention_mask in self._batches(token_ids_list):
                values[indices] = model(input_ids, attention_mask).double().cpu().numpy()
        return values

    def train_step(self, token_ids_list: Sequence[Sequence[int]],
                   targets: Sequence[float]) -> dict[str, float]:
        """One AdamW step on sum_i (V(x_i) - p_i)^2 (algorithm step 8; `pcl.rl.value_loss`, reduction "sum").

        Args:
            token_ids_list: m prompts (token ids).
            targets: m pass rates p_i = mean_j r_ij, each in [0, 1].

        Returns:
            loss (the summed squared error before the step), grad_norm (total norm before clipping),
            num_prompts, skipped (1.0 when a non-finite gradient made the step a no-op, else 0.0).
        """
        targets_tensor = self._check_targets(token_ids_list, targets)
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        for indices, input_ids, attention_mask in self._batches(token_ids_list):
            values = self.model(input_ids, attention_mask)  # [b]
            batch_targets = targets_tensor[indices].to(values.device)
            # The sum over prompts splits exactly over micro-batches, so accumulated gradients equal the
            # full batch's.
            loss = value_loss(values, batch_targets, reduction="sum")
            loss.backward()
            total_loss += loss.item()
        grad_norm, skipped = self._clip_and_step()
        return {"loss": total_loss, "grad_norm": grad_norm, "num_prompts": float(len(targets_tensor)),
                "skipped": float(skipped)}

    def _clip_and_step(self) -> tuple[float, bool]:
        """Clip the accumulated gradient, step unless its norm is not finite, refresh the scoring copy.

        Returns the gradient norm before clipping and whether the step was skipped."""
        max_norm = self.grad_clip if self.grad_clip is not None else math.inf
        grad_norm = total_norm(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)  # a NaN step would destroy the weights
        else:
            self.optimizer.step()
            self.steps += 1
            self.refresh_scorer()
        return grad_norm, skipped

    def _check_targets(self, token_ids_list: Sequence[Sequence[int]], targets: Sequence[float],
                       allow_empty: bool = False) -> torch.Tensor:
        check_prompts(list(token_ids_list), self.model.vocab_size)
        targets_tensor = torch.as_tensor(np.asarray(targets, dtype=np.float32))
        if targets_tensor.ndim != 1 or len(targets_tensor) != len(token_ids_list):
            raise ValueError(f"targets: expected {len(token_ids_list)} pass rates (one per prompt), "
                             f"got shape {tuple(targets_tensor.shape)}")
        if len(targets_tensor) == 0 and not allow_empty:
            raise ValueError("token_ids_list: train_step needs at least one prompt")
        if not bool(((targets_tensor >= 0) & (targets_tensor <= 1)).all()):
            raise ValueError(f"targets: pass rates must be in [0, 1], got {targets_tensor.tolist()!r:.120}")
        return targets_tensor

    def state_dict(self) -> dict[str, Any]:
        """Model weights, optimizer state and step count (for checkpoints).

        The tensors are the live ones, not copies: serialise (or copy) them before the next train_step.
        """
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "steps": self.steps}

    def save_checkpoint(self, directory: str | Path) -> None:
        """V in Hugging Face format (backbone + head, `ValueModel.from_pretrained` loads it) plus `trainer.pt`:
        weights, optimizer state, step count and torch's RNG state."""
        directory = Path(directory)
        self.model.save_pretrained(directory)
        torch.save({**self.state_dict(), "rng": torch.get_rng_state()}, directory / "trainer.pt")

    def load_checkpoint(self, directory: str | Path) -> None:
        state = load_tensors(Path(directory) / "trainer.pt", map_location=self.model.device)
        self.load_state_dict(state)
        if "rng" in state:
            torch.set_rng_state(state["rng"].cpu())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("model", "optimizer", "steps"):
            if key not in state:
                raise ValueError(f"value trainer state: missing key {key!r}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self.refresh_scorer()


def value_step_figures(stats: dict[str, float], seconds: float) -> dict[str, float]:
    """A V step's figures as the step record names them: `train_step`'s under `value_`, and its wall time."""
    return {**{f"value_{k}": float(v) for k, v in stats.items()}, "value_train_seconds": seconds}
