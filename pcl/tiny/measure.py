"""The tiny build's measurements: sampled pass rates of the warm-started policy with the project's reward, their
spread (the curriculum matters only if easy, intermediate and hard prompts all occur) and the report's text."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from pcl.reward.verdict import response_reward
from pcl.tiny.task import format_prompt
from pcl.tiny.tasks import ARITH

MEASURE_SAMPLES = 16  # samples per prompt of the build's measurement (report.json's pass_rates)


@contextmanager
def deterministic_cpu(threads: int) -> Iterator[None]:
    """Fixed thread count and deterministic kernels (a build's warm-up and measurement, a re-measurement of a
    shipped policy); the caller's settings come back after."""
    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(previous_deterministic)


def measure_pass_rates(model, tokenizer, rows: list[dict], samples: int, seed: int,
                       batch_prompts: int = 128, progress: Callable[[int], None] | None = None,
                       response: Callable[[dict], str] = ARITH.response) -> list[float]:
    """Per-prompt pass rate: the mean reward of `samples` responses sampled at temperature 1.

    Batched HF generate with left padding; max_new_tokens is the batch's longest `response` + 2, and a
    response that does not end with EOS within it is truncated and scores 0 (algorithm step 5).
    """
    torch.manual_seed(seed)
    rates = []
    for start in range(0, len(rows), batch_prompts):
        chunk = rows[start : start + batch_prompts]
        encoded = tokenizer([format_prompt(r["problem"]) for r in chunk], padding=True, return_tensors="pt")
        with torch.no_grad():
            output = model.generate(
                **encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=samples,
                max_new_tokens=max(len(response(r)) for r in chunk) + 2,
            )
        responses = output[:, encoded.input_ids.shape[1] :].view(len(chunk), samples, -1)  # [prompts, n, T]
        for row, row_responses in zip(chunk, responses):
            rewards = []
            for sample in row_responses.tolist():
                stopped = tokenizer.eos_token_id in sample  # else truncated: scored 0, not verified
                text = tokenizer.decode(sample[: sample.index(tokenizer.eos_token_id)], skip_special_tokens=True) \
                    if stopped else ""
                rewards.append(response_reward("stop" if stopped else "length", text, row["answer"]))
            rates.append(sum(rewards) / samples)
        if progress is not None:
            progress(len(chunk))
    return rates


def summarize(rates: list[float], difficulties: list[int], level_name: Callable[[int], str] = ARITH.level_name
              ) -> dict:
    """The spread of pass rates: 10-bin histogram, mean, share in [0.1, 0.9], mean by difficulty level."""
    histogram = [0] * 10
    for rate in rates:
        histogram[min(int(rate * 10 + 1e-9), 9)] += 1
    by_level: dict[int, list[float]] = {}
    for rate, level in zip(rates, difficulties):
        by_level.setdefault(level, []).append(rate)
    return {
        "prompts": len(rates),
        "mean": sum(rates) / len(rates),
        "intermediate_share": sum(0.1 <= r <= 0.9 for r in rates) / len(rates),
        "never_share": sum(r < 0.1 for r in rates) / len(rates),
        "always_share": sum(r > 0.9 for r in rates) / len(rates),
        # uniform GRPO's expected effective ratio at n=8: the chance a prompt's 8 samples are not all alike
        "effective_ratio_n8": sum(1 - r**8 - (1 - r) ** 8 for r in rates) / len(rates),
        "histogram": histogram,
        "by_difficulty": {
            str(level): {"name": level_name(level), "prompts": len(v), "mean": sum(v) / len(v)}
            for level, v in sorted(by_level.items())
        },
    }


def format_report(report: dict) -> str:
    """A human-readable summary of report.json's pass rates and timings."""
    rates = report["pass_rates"]
    peak = max(rates["histogram"]) or 1
    samples = f"{MEASURE_SAMPLES} samples each, temperature 1"
    lines = []
    if "warmup_steps_taken" in report:
        stopped = report["warmup_steps_taken"] < report["warmup_steps"]
        lines.append(f"warm-up: {report['warmup_steps_taken']} of at most {report['warmup_steps']} steps"
                     + (f", stopped at the probe pass rate {report['probes'][-1]['pass_rate']:.3f} "
                        f"(target {report['target_pass_rate']})" if stopped else ""))
    lines.append(f"pass rates of {rates['prompts']} training prompts ({samples}):")
    for i, count in enumerate(rates["histogram"]):
        bar = "#" * round(40 * count / peak)
        lines.append(f"  [{i / 10:.1f}, {(i + 1) / 10:.1f}{']' if i == 9 else ')'} {count:5d} {bar}")
    lines.append(f"  mean pass rate {rates['mean']:.3f}; "
                 f"share with 0.1 <= p <= 0.9: {rates['intermediate_share']:.1%}")
    if "never_share" in rates:  # reports of older builds lack these
        lines.append(f"  p < 0.1: {rates['never_share']:.1%}; p > 0.9: {rates['always_share']:.1%}; uniform GRPO's "
                     f"expected effective ratio at n=8: {rates['effective_ratio_n8']:.3f}")
    for level, stats in rates["by_difficulty"].items():
        lines.append(f"  difficulty {level} ({stats['name']}): {stats['prompts']:4d} prompts, "
                     f"mean {stats['mean']:.3f}")
    lines.append(
        f"build {report['build_seconds']:.1f}s (warm-up {report['warmup_seconds']:.1f}s, measurement "
        f"{report['measure_seconds']:.1f}s, {report['cpu_seconds']:.0f} CPU seconds, load average "
        f"{report['load_average']:.2f})"
    )
    return "\n".join(lines)
