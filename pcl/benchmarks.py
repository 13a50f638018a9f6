"""The evaluation suite of the paper: avg@k on MATH500, AIME24, AIME25, AMC23, Minerva and OlympiadBench.

    plan = eval_plan(cfg)                                      # from a run config: its evaluation section
    suite = load_suite(plan.names, tokenizer, cfg.data.template, root=eval_data_root(cfg.data.root), limit=None)
    results = evaluate(engine, pool, suite, plan.ks, plan.sampling, plan.max_new_tokens)
    print(format_table(results)); write_reports(results, out_dir, meta)

avg@k of a benchmark is the mean over its prompts of the mean reward of k samples (AIME24, AIME25 and AMC23:
k=32; Minerva: 4; MATH500 and OlympiadBench: 1, as in the paper), decoded as the paper does (temperature 0.6,
top_p 0.95, top_k 20) with its prompt template; a truncated response scores 0 (and is not sent to the verifier).
Benchmarks are read from local copies under the data root (`data.root`, else `PCL_DATA_ROOT`, else the
`shared/data` checkout beside the repository when there is one; a root whose files sit in a `math/` folder is
followed into it), else from the Hugging Face hub. `pcl eval` runs the suite on a model (`eval_plan` reads what to
run from the config's `evaluation` section); a training run runs the same suite every `evaluation.every` steps
through its rollout fleet.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pcl.config import DataConfig
from pcl.data.datasets import KNOWN
from pcl.data.prompts import load_prompts
from pcl.engines.request import SamplingParams
from pcl.reward.verdict import TRUNCATED_REWARD, is_truncated

SUITE = ("math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench")
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # a data checkout beside the repository


def best_score(record: dict[str, Any], best_by: str) -> float:
    """The score of an evaluated step that picks the best checkpoint: `suite_average` for "average", else the one
    benchmark's `suite_<name>` (the paper picks MATH runs by MATH500, DeepScaleR runs by the six-benchmark average).

    >>> best_score({"suite_math500": 0.5, "suite_aime24": 0.1, "suite_average": 0.3}, "math500")
    0.5
    """
    key = "suite_average" if best_by == "average" else f"suite_{best_by}"
    if key not in record:
        raise KeyError(f"evaluation.best_by={best_by!r}: the evaluated step has no {key} (its suite: "
                       f"{sorted(k[6:] for k in record if k.startswith('suite_'))})")
    return float(record[key])


def eval_data_root(given: str | None) -> str | None:
    """Where the benchmarks' local copies are: `given` (data.root, which the config loader fills from PCL_DATA_ROOT),
    else SHARED_DATA when it exists; a root without the files but with a `math/` folder holding them means that
    folder. None: the hub."""
    root = given
    if root is None:
        if not SHARED_DATA.is_dir():
            return None
        root = str(SHARED_DATA)
    path = Path(root).expanduser()
    files = [KNOWN[n].file for n in SUITE]
    if not any((path / f).is_file() for f in files) and any((path / "math" / f).is_file() for f in files):
        path = path / "math"
    return str(path)


@dataclass(frozen=True)
class EvalPlan:
    """What `pcl eval` runs: the benchmarks, k of each, the decoding and the response budget."""

    names: list[str]
    ks: dict[str, int]
    sampling: dict[str, float | int]  # temperature, top_p, top_k
    max_new_tokens: int

    def sampling_params(self, n: int, seed: int | None = None) -> SamplingParams:
        """The plan's decoding with n samples per prompt (a ValueError names a bad setting)."""
        return SamplingParams(n=n, max_new_tokens=self.max_new_tokens, seed=seed, **self.sampling)


def eval_plan(cfg) -> EvalPlan:
    """The plan of a run config (`pcl.config.Config`), every default its `evaluation` section's: the suite (all six
    benchmarks when empty), k (the paper's for those not named), temperature, top_p, top_k, and max_new_tokens
    (rollout.max_new_tokens when unset). A k of a benchmark not among the six: ValueError naming evaluation.k."""
    ev = cfg.evaluation
    names = list(ev.suite) or list(SUITE)
    try:
        ks = parse_k(dict(ev.k), names)
    except ValueError as exc:
        raise ValueError(f"evaluation.{exc}") from None
    sampling = {"temperature": ev.temperature, "top_p": ev.top_p, "top_k": ev.top_k}
    return EvalPlan(names, ks, sampling, ev.max_new_tokens or cfg.rollout.max_new_tokens)


def default_out_dir(model: str, model_path: str) -> Path:
    """evals/<name>: a tiny task's name, a checkpoint's policy as <run>-step-NNNNNN, else the model directory's name."""
    path = Path(model_path)
    if model in ("tiny", "tiny-carry"):
        name = model
    elif path.name == "policy" and path.parent.name.startswith("step-"):
        name = f"{path.parents[2].name}-{path.parent.name}"  # RUN/checkpoints/step-NNNNNN/policy
    else:
        name = path.name or "model"
    return Path("evals") / name


def default_k(name: str) -> int:
    return KNOWN[name].k


def parse_k(text: str | int | dict | None, names: list[str]) -> dict[str, int]:
    """k per benchmark of `names`: the paper's defaults, overridden by an int for all, a dict, or text such as
    '8' (all), 'aime24=8,math500=2' (those named) or '2,aime24=8' (all 2 but AIME24). Bad values: ValueError."""
    ks = {n: default_k(n) for n in names}
    if text is None or text == "":
        return ks
    if isinstance(text, dict):
        parts = [(str(name), value) for name, value in text.items()]
    elif isinstance(text, int):
        parts = [("", text)]
    else:
        parts = [tuple(part.split("=", 1)) if "=" in part else ("", part) for part in str(text).split(",")]
    for name, value in sorted(parts, key=lambda part: bool(part[0].strip())):  # the value for all first
        name, value = name.strip().lower(), str(value).strip()
        if name and name not in SUITE:
            raise ValueError(f"k: unknown benchmark {name!r}; the suite has: {', '.join(SUITE)}")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"k: {f'{name}={value}' if name else repr(value)} must be a positive integer")
        if not name:
            ks = dict.fromkeys(ks, int(value))
        elif name in ks:  # a benchmark outside `names` keeps no k
            ks[name] = int(value)
    return ks


def load_suite(names: list[str], tokenizer: Any, template: str, root: str | None = None,
               limit: int | None = None, max_prompt_tokens: int = 4096) -> dict[str, list]:
    """The prompt records of each benchmark (ids prefixed `<name>/`), the first `limit` of each when set."""
    suite = {}
    for name in names:
        cfg = DataConfig(source=name, root=root, template=template, max_prompt_tokens=max_prompt_tokens)
        records, _ = load_prompts(cfg, tokenizer)
        records = records[:limit] if limit else records
        suite[name] = [replace(r, id=f"{name}/{r.id}") for r in records]
    return suite


def avg_at_k(rewards: list[list[float]] | np.ndarray) -> float:
    """Mean over prompts of the mean reward of each prompt's k samples."""
    rows = [np.asarray(r, dtype=np.float64) for r in rewards]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("avg_at_k needs at least one prompt with at least one sample each")
    return float(np.mean([r.mean() for r in rows]))


def accuracy_with_se(rewards: list[list[float]] | np.ndarray) -> tuple[float, float]:
    """avg@k and the standard error of its sampling on these prompts: sqrt(sum_i s_i^2 / k_i) / prompts, s_i^2 the
    unbiased variance of prompt i's k_i rewards. It is what moves between two evaluations of one policy on one
    held-out set (runs compared on the same set share the choice of prompts, so that is left out). nan when a prompt
    has fewer than 2 samples.

    >>> accuracy_with_se([[1, 1], [0, 0], [1, 0], [0, 1]])
    (0.5, 0.25)
    """
    accuracy = avg_at_k(rewards)
    rows = [np.asarray(r, dtype=np.float64) for r in rewards]
    if any(len(r) < 2 for r in rows):
        return accuracy, float("nan")
    return accuracy, float(np.sqrt(sum(r.var(ddof=1) / len(r) for r in rows)) / len(rows))


@dataclass
class BenchmarkResult:
    name: str
    k: int
    prompts: int
    samples: int
    avg_at_k: float
    solved_any: int  # prompts with at least one correct sample of the k
    truncated: int
    timeouts: int
    seconds: float
    per_prompt: dict[str, float] = field(default_factory=dict)  # prompt id -> mean reward of its k samples


def summarize(name: str, k: int, rewards: dict[str, list[float]], truncated: int = 0, timeouts: int = 0,
              seconds: float = 0.0) -> BenchmarkResult:
    bad = {pid: len(r) for pid, r in rewards.items() if len(r) != k}
    if bad:
        raise ValueError(f"{name}: expected {k} samples per prompt, got {dict(list(bad.items())[:3])}")
    return BenchmarkResult(name, k, len(rewards), sum(len(r) for r in rewards.values()),
                           avg_at_k(list(rewards.values())), sum(max(r) > 0 for r in rewards.values()),
                           truncated, timeouts, seconds, {pid: float(np.mean(r)) for pid, r in rewards.items()})


def evaluate(engine, pool, suite: dict[str, list], ks: dict[str, int], sampling: dict, max_new_tokens: int,
             seed: int = 0, batch_size: int = 256, progress: bool = True) -> list[BenchmarkResult]:
    """Generate k samples of every prompt with `engine`, score them with `pool` (a RewardPool).

    Each `generate` call holds about `batch_size` sequences (max(1, batch_size // k) prompts x k samples); the
    seed of a call is derived from `seed` and its first prompt, so a result does not depend on other benchmarks.
    A truncated response ("length") scores 0 without being verified; a verifier timeout scores 0 and is counted.
    """
    from tqdm import tqdm

    results = []
    for name, records in suite.items():
        start, k = time.perf_counter(), ks[name]
        per_call = max(1, batch_size // k)
        rewards: dict[str, list[float]] = {}
        truncated = timeouts = 0
        bar = tqdm(total=len(records), desc=f"eval {name} (k={k})", unit="prompt", disable=not progress,
                   leave=False, file=sys.stderr)
        for first in range(0, len(records), per_call):
            chunk = records[first:first + per_call]
            params = SamplingParams(n=k, max_new_tokens=max_new_tokens, seed=seed + first, **sampling)
            groups = engine.generate([list(r.prompt_token_ids) for r in chunk], params)
            finished = [(i, j) for i, gens in enumerate(groups) for j, g in enumerate(gens)
                        if not is_truncated(g.finish_reason)]
            pairs = [(groups[i][j].text, chunk[i].answer) for i, j in finished]
            scored = dict(zip(finished, pool.score_batch(pairs) if pairs else []))
            for i, (r, gens) in enumerate(zip(chunk, groups)):
                row = []
                for j in range(len(gens)):
                    outcome = scored.get((i, j))
                    truncated += int(outcome is None)
                    timeouts += int(outcome is not None and outcome.timed_out)
                    row.append(TRUNCATED_REWARD if outcome is None else float(outcome.reward))
                rewards[r.id] = row
            bar.update(len(chunk))
        bar.close()
        results.append(summarize(name, k, rewards, truncated, timeouts, time.perf_counter() - start))
    return results


def suite_mean(results: list[BenchmarkResult]) -> float:
    """The unweighted mean of the benchmarks' avg@k (the paper's 'average' column)."""
    return float(np.mean([r.avg_at_k for r in results]))


def format_table(results: list[BenchmarkResult]) -> str:
    header = f"{'benchmark':<14}{'k':>4}{'prompts':>9}{'samples':>9}{'avg@k':>9}{'solved':>8}{'trunc':>7}{'t/o':>5}"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.name:<14}{r.k:>4}{r.prompts:>9}{r.samples:>9}{r.avg_at_k:>9.4f}{r.solved_any:>8}"
                     f"{r.truncated:>7}{r.timeouts:>5}")
    lines.append(f"{'average':<14}{'':>4}{'':>9}{'':>9}{suite_mean(results):>9.4f}")
    return "\n".join(lines)


def write_reports(results: list[BenchmarkResult], out_dir: str | Path, meta: dict) -> tuple[Path, Path]:
    """eval.json (everything, per-prompt means included) and eval.md (the table) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {**meta, "average": suite_mean(results), "benchmarks": [asdict(r) for r in results]}
    (out / "eval.json").write_text(json.dumps(data, indent=2))
    rows = "\n".join(f"| {r.name} | {r.k} | {r.prompts} | {r.samples} | {r.avg_at_k:.4f} | {r.solved_any} | "
                     f"{r.truncated} | {r.timeouts} |" for r in results)
    settings = ", ".join(f"{k}={v}" for k, v in meta.items() if k not in ("benchmarks",))
    (out / "eval.md").write_text(
        f"# Evaluation of {meta.get('model', '?')}\n\n{settings}\n\n"
        "| benchmark | k | prompts | samples | avg@k | solved (any of k) | truncated | timeouts |\n"
        "|---|---|---|---|---|---|---|---|\n" + rows + f"\n| **average** | | | | **{suite_mean(results):.4f}** | | | |\n")
    return out / "eval.json", out / "eval.md"
