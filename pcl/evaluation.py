"""The evaluation suite of the paper: avg@k on MATH500, AIME24, AIME25, AMC23, Minerva and OlympiadBench.

    suite = load_suite(["math500", "aime24"], tokenizer, template="qwen_base", root="/data/math", limit=None)
    results = evaluate(engine, pool, suite, ks={"aime24": 32}, sampling=EVAL_SAMPLING)
    print(format_table(results)); write_reports(results, out_dir, meta)

avg@k of a benchmark is the mean over its prompts of the mean reward of k samples (AIME24, AIME25 and AMC23:
k=32; Minerva: 4; MATH500 and OlympiadBench: 1, as in the paper), decoded as the paper does (temperature 0.6,
top_p 0.95, top_k 20) with its prompt template; a truncated response scores 0. `pcl eval` runs it on a model;
a training run runs the same suite every `evaluation.every` steps through its rollout fleet.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pcl.datasets import KNOWN

SUITE = ("math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench")
PAPER_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


def default_k(name: str) -> int:
    return KNOWN[name].k


def parse_suite(text: str | list[str]) -> list[str]:
    names = [n.strip().lower() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    unknown = [n for n in names if n not in SUITE]
    if unknown or not names:
        raise ValueError(f"unknown benchmark(s) {unknown or text!r}; the suite has: {', '.join(SUITE)}")
    return list(dict.fromkeys(names))


def parse_k(text: str | int | dict | None, names: list[str]) -> dict[str, int]:
    """k per benchmark: the paper's defaults, overridden by an int for all, a dict, or 'aime24=8,math500=2'."""
    ks = {n: default_k(n) for n in names}
    if text is None or text == "":
        return ks
    if isinstance(text, int) or (isinstance(text, str) and text.strip().isdigit()):
        return {n: _positive(int(text), "k") for n in names}
    items = text.items() if isinstance(text, dict) else (
        part.split("=", 1) if "=" in part else (part, "") for part in str(text).split(","))
    for name, value in items:
        name = str(name).strip().lower()
        if name not in SUITE:
            raise ValueError(f"k: unknown benchmark {name!r}; the suite has: {', '.join(SUITE)}")
        try:
            ks[name] = _positive(int(value), f"k for {name}")
        except (TypeError, ValueError):
            raise ValueError(f"k: {name}={str(value).strip()} must be a positive integer") from None
    return ks


def _positive(value: int, what: str) -> int:
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return value


def load_suite(names: list[str], tokenizer: Any, template: str, root: str | None = None,
               limit: int | None = None, max_prompt_tokens: int = 4096) -> dict[str, list]:
    """The prompt records of each benchmark (ids prefixed `<name>/`), the first `limit` of each when set."""
    from pcl.config import DataConfig
    from pcl.data import load_prompts

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
             seed: int = 0, progress: bool = True) -> list[BenchmarkResult]:
    """Generate k samples of every prompt with `engine`, score them with `pool` (a RewardPool)."""
    from tqdm import tqdm

    from pcl.engines.base import SamplingParams

    results = []
    for name, records in suite.items():
        start, k = time.perf_counter(), ks[name]
        rewards: dict[str, list[float]] = {}
        truncated = timeouts = 0
        bar = tqdm(total=len(records), desc=f"eval {name} (k={k})", unit="prompt", disable=not progress, leave=False)
        for first in range(0, len(records), 32):
            chunk = records[first:first + 32]
            params = SamplingParams(n=k, max_new_tokens=max_new_tokens, seed=seed + first, **sampling)
            groups = engine.generate([list(r.prompt_token_ids) for r in chunk], params)
            pairs = [(g.text, r.answer) for r, gens in zip(chunk, groups) for g in gens]
            outcomes = pool.score_batch(pairs)
            for i, (r, gens) in enumerate(zip(chunk, groups)):
                row = []
                for j, g in enumerate(gens):
                    outcome = outcomes[i * k + j]
                    timeouts += int(outcome.timed_out)
                    truncated += int(g.finish_reason == "length")
                    row.append(0.0 if g.finish_reason == "length" else float(outcome.reward))
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
