"""ValueScorer actor: the value model V (DESIGN 1.2 and 1.8).

Scores the k*m candidates each step in batches (prompt-only forward pass) and trains on the m selected
prompts' realised pass rates once their rewards are in, with its own optimizer. A thin wrapper over
`pcl.value.ValueTrainer`.

Ray restarts it when its process dies; the restarted scorer takes V (weights, optimizer, RNG) from the run's
newest complete checkpoint, so V loses at most the steps since then, and the call in flight is retried.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import ray

from actors.runtime import init_actor_process


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class ValueScorerActor:
    def __init__(self, model_path: str, lr: float, grad_clip: float | None, batch_size: int, device: str,
                 dtype: str, seed: int, threads: int = 1, checkpoints: str | None = None):
        init_actor_process(threads)
        import torch

        from pcl.value import ValueModel, ValueTrainer

        torch.manual_seed(seed)
        model = ValueModel.from_pretrained(model_path, dtype=dtype, device=device)
        self.trainer = ValueTrainer(model, lr=lr, grad_clip=grad_clip, batch_size=batch_size)
        self.restored_from = None
        if checkpoints:  # a restart (or a resumed run's start): V as of the newest checkpoint
            from pcl.checkpoint import latest

            found = latest(checkpoints)
            if found is not None and (found / "value").is_dir():
                self.trainer.load_checkpoint(found / "value")
                self.restored_from = str(found)

    def score(self, prompt_token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """[len(prompts)] predicted pass rates in [0, 1]."""
        return self.trainer.score([list(p) for p in prompt_token_ids])

    def train(self, prompt_token_ids: Sequence[Sequence[int]], pass_rates: Sequence[float]) -> dict[str, float]:
        """One optimizer step on sum_i (V(x_i) - p_i)^2 over the selected prompts."""
        start = time.perf_counter()
        stats = self.trainer.train_step([list(p) for p in prompt_token_ids], np.asarray(pass_rates, dtype=np.float64))
        stats = {f"value_{k}": float(v) for k, v in stats.items()}
        stats["value_train_seconds"] = time.perf_counter() - start
        return stats

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def save_checkpoint(self, directory: str) -> None:
        self.trainer.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.trainer.load_checkpoint(directory)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)

    def ping(self) -> bool:
        return True
