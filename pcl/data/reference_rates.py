"""Reference pass rates: the initial policy's mean reward on every training prompt, from n_pre rollouts each.

The prefilter strategy keeps the prompts whose reference pass rate lies between p_low and p_high; every
strategy's run can report the reference difficulty of the prompts it selected. The rates are computed once,
before the first step, and cached in the run directory keyed by prompt id:

    rates = load_reference(run_dir / REFERENCE_FILE, policy="tiny", prompts=train_prompts, n_pre=8)
    if rates is None:                                        # no cache, or one for other data / policy / n_pre
        rates = pass_rates(samples)                          # mean reward per prompt id
        save_reference(run_dir / REFERENCE_FILE, "tiny", train_prompts, 8, rates)

A cache records the policy it was measured with, n_pre and the fingerprint of the training prompts
(`pcl.data.fingerprint`: ids, questions, answers and templated texts): the tiny task's prompts depend on the run
seed, so ids alone would not say which prompts they were. A cache written before it kept that fingerprint (a
digest of the ids and templated texts) is still used for the same prompts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from pcl.data.fingerprint import data_fingerprint, same_prompts

REFERENCE_FILE = "reference_pass_rates.json"


def pass_rates(samples: Iterable) -> dict[str, float]:
    """prompt id -> mean reward of its samples (`pcl.samples.Sample`s)."""
    sums: dict[str, list[float]] = {}
    for s in samples:
        sums.setdefault(s.prompt_id, []).append(s.reward)
    return {pid: sum(r) / len(r) for pid, r in sums.items()}


def save_reference(path: str | os.PathLike, policy: str, prompts: Sequence, n_pre: int,
                   rates: Mapping[str, float]) -> None:
    """Write the cache atomically (a killed write leaves no partial file)."""
    missing = [p.id for p in prompts if p.id not in rates]
    if missing:
        raise ValueError(f"reference pass rates missing for {len(missing)} prompts, e.g. {missing[:3]}")
    body = {"policy": policy, "n_pre": n_pre, "prompts": len(prompts), "fingerprint": data_fingerprint(prompts),
            "pass_rates": {p.id: float(rates[p.id]) for p in prompts}}
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def load_reference(path: str | os.PathLike, policy: str, prompts: Sequence,
                   n_pre: int | None = None) -> dict[str, float] | None:
    """The cached rates when the file exists and was made for this policy, these prompts and (unless None)
    this n_pre; else None. A file that is not a cache is an error naming it."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text())
        rates = {str(k): float(v) for k, v in body["pass_rates"].items()}
        made_for = (body["policy"], int(body["n_pre"]), body["fingerprint"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a reference pass-rate cache ({exc!r}); delete it to recompute") from None
    if made_for[0] != policy or (n_pre is not None and made_for[1] != n_pre) or not same_prompts(made_for[2], prompts):
        return None
    return rates
