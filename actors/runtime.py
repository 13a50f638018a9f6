"""Process set-up shared by the actors: torch thread counts and quiet logging.

On the embedded default many actors share two cores, so each pins torch to a small thread pool; on a GPU
node the count comes from the actor's CPU reservation instead.
"""

from __future__ import annotations

import logging
import os


def init_actor_process(threads: int = 1) -> None:
    """Pin torch's intra-op threads (before any heavy work) and keep library logging terse."""
    import torch

    torch.set_num_threads(max(1, threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("transformers", "ray", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a hard dependency
        pass
