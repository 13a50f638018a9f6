"""Build the embedded default's tiny task and warm-started policy: `pcl make-tiny`.

    path = build_tiny(seed=0)          # cached under $PCL_CACHE/tiny/seed-0 (default ~/.cache/pcl)
    AutoModelForCausalLM.from_pretrained(path); AutoTokenizer.from_pretrained(path)

A build writes, into a temporary directory renamed into place when complete:
  config.json, model.safetensors, generation_config.json   the tiny Qwen3 policy (save_pretrained)
  tokenizer.json, tokenizer_config.json                    the character-level tokenizer
  train.jsonl, eval.jsonl                                  the task's splits (rows of pcl.tiny.task)
  report.json                                              warm-up loss, measured pass rates, timings
  COMPLETE                                                 the marker, written last
The policy is warm-started by a short supervised run on the training split whose length is a step count
(not wall time), so a seed gives the same weights on the same machine. The warm-up ends in a steep phase (the
policy learns to carry digits), where a few steps move the pass rate by several points and where CPUs with
other float kernels arrive a little earlier or later. So from PROBE_FROM on, every PROBE_EVERY steps, the
build samples a fixed probe set and stops once its mean pass rate reaches TARGET_PASS_RATE (the learning
rate decays over WARMUP_DECAY_STEPS; a build short of the target then goes on at the floor rate, up to
WARMUP_STEPS): the starting policy is about as strong on every machine (the embedded default's settings are
tuned for it), not merely trained for as many steps. The build then measures the policy's sampled pass rates
on training prompts with the project's reward and reports their spread: the curriculum matters only if
easy, intermediate and hard prompts all occur. The warm-up is `pcl.tiny.warmup`, the measurement
`pcl.tiny.measure`; a build with a shipped policy's settings installs it instead (`pcl.tiny.shipped`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from pcl.progress import Progress
from pcl.tiny.measure import MEASURE_SAMPLES, deterministic_cpu, format_report, measure_pass_rates, summarize
from pcl.tiny.shipped import load_shipped_weights, shipped_paths, shipped_record
from pcl.tiny.tasks import ARITH, TinyTask, tiny_task
from pcl.tiny.tokenizer import build_tokenizer
from pcl.tiny.warmup import encode_for_training, warm_up

MARKER = "COMPLETE"
TRAIN_SIZE = 4096  # rows in train.jsonl (the config's data.tiny_size default)
EVAL_SIZE = 1024  # rows in eval.jsonl (covers data.eval_size)
# Many small batches rather than fewer large ones at the same compute: the warm-up's plateau (before the
# policy learns to align the units digits) ends after a number of updates, not of examples. The learning rate
# decays over WARMUP_DECAY_STEPS and then stays at its floor; a build whose probes have not reached the
# target by then goes on (over the same shuffled rows again) up to WARMUP_STEPS.
WARMUP_DECAY_STEPS = ARITH.decay_steps  # each task family (pcl.tiny.tasks) sets its own; these are "tiny"'s
WARMUP_STEPS = ARITH.warmup_steps
WARMUP_BATCH = 64
WARMUP_LR = 2e-3
MEASURE_PROMPTS = 512
# The warm-up's stop: the first probe (PROBE_PROMPTS training prompts x PROBE_SAMPLES samples, ~1.5 s) from
# step PROBE_FROM on, every PROBE_EVERY steps, whose mean pass rate reaches TARGET_PASS_RATE; else WARMUP_STEPS.
TARGET_PASS_RATE = ARITH.target_pass_rate
PROBE_FROM = ARITH.probe_from
PROBE_EVERY = 20
PROBE_PROMPTS = 128
PROBE_SAMPLES = 8
# The settings a cached build records in its marker; a build of an older format is rebuilt, not reused.
BUILD_FORMAT = 3  # 3: head_dim 32 (vLLM's CPU attention refuses 16)
# One thread: CPU float reductions can depend on the thread count, so one fixed count keeps a seed's weights
# the same on any machine, and the small warm-up batches gain little from a second thread while a busy
# machine (Ray actors, other jobs) makes two threads slower than one.
BUILD_THREADS = 1


def cache_root() -> Path:
    """$PCL_CACHE, or ~/.cache/pcl."""
    return Path(os.environ.get("PCL_CACHE") or Path.home() / ".cache" / "pcl")


def tiny_dir(seed: int = 0, task: str = "tiny") -> Path:
    """Where the tiny build of a task family for a seed is cached: $PCL_CACHE/<task>/seed-<seed>."""
    return cache_root() / tiny_task(task).name / f"seed-{seed}"


def _marker(path: str | os.PathLike) -> dict | None:
    """The settings a finished build at `path` recorded in its marker, or None if it holds none."""
    try:
        recorded = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def is_complete(path: str | os.PathLike) -> bool:
    """True when `path` holds a finished build: its marker exists and records the build's settings."""
    return _marker(path) is not None


def policy_config(tokenizer, max_positions: int = 64) -> "Qwen3Config":
    """The tiny Qwen3 architecture: 4 layers, width 128, 8 heads of 32, about 1.1 M parameters (tied embeddings).

    Eight heads rather than four, and an initialisation wider than the default 0.02 (about 1/sqrt(width)):
    with both, the warm-up finds the digit-alignment attention within a few hundred steps; with the defaults
    some seeds stay on a plateau (units digits wrong) for over 1000 steps. Each head is 32 wide (the
    attention width, 256, exceeds the model width, as Qwen3 allows): vLLM's CPU attention refuses
    head_dim 16 ("Unsupported CPU attention configuration"), and both engines must run this policy.
    """
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, head_dim=32, max_position_embeddings=max_positions,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=0.08, attn_implementation="eager",
    )


def _save_quietly(model, out: Path) -> None:
    """save_pretrained without transformers' progress bar (a one-shard bar is noise in the build log)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def build_tiny(
    seed: int = 0, out_dir: str | os.PathLike | None = None, force: bool = False, verbose: bool = False,
    steps: int | None = None, measure_prompts: int = MEASURE_PROMPTS,
    target_pass_rate: float | None | str = "task", probe_from: int | None = None, probe_every: int = PROBE_EVERY,
    task: str = "tiny", from_scratch: bool = False,
) -> Path:
    """Build (or find cached) a tiny task family (pcl.tiny.tasks: "tiny", "tiny-carry"), its tokenizer and
    warm-started policy; returns its directory.

    `steps` (the most warm-up steps), `target_pass_rate` and `probe_from` default to the task family's, the
    other probe settings and `measure_prompts` to the real build's; tests pass smaller values.
    `target_pass_rate=None` trains all `steps` without probing. A build with the settings of a policy shipped
    in the package (pcl.tiny.shipped) installs its weights instead of warming up, unless `from_scratch`.
    """
    family = tiny_task(task)
    steps = family.warmup_steps if steps is None else steps
    target_pass_rate = family.target_pass_rate if target_pass_rate == "task" else target_pass_rate
    probe_from = family.probe_from if probe_from is None else probe_from
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 1 <= measure_prompts <= TRAIN_SIZE:
        raise ValueError(f"measure_prompts must be in [1, {TRAIN_SIZE}] (train.jsonl), got {measure_prompts}")
    if target_pass_rate is not None and not 0.0 <= target_pass_rate <= 1.0:
        raise ValueError(f"target_pass_rate must be in [0, 1] or None, got {target_pass_rate!r}")
    if probe_from < 1 or probe_every < 1:
        raise ValueError(f"probe_from and probe_every must be >= 1, got {probe_from} and {probe_every}")
    target = Path(out_dir) if out_dir is not None else tiny_dir(seed, task)
    log = (lambda msg: print(msg, flush=True)) if verbose else (lambda _msg: None)  # flushed: logs show it live
    wanted = {"format": BUILD_FORMAT, "seed": seed, "warmup_steps": steps, "decay_steps": family.decay_steps,
              "measure_prompts": measure_prompts, "target_pass_rate": target_pass_rate, "probe_from": probe_from,
              "probe_every": probe_every}
    if family is not ARITH:  # the arithmetic task's markers predate task families
        wanted["task"] = family.name
    recorded = _marker(target)
    if recorded is not None and not force:
        if recorded.get("format") == BUILD_FORMAT:
            return _cached(target, recorded, wanted, log)
        print(f"{target} holds a tiny build of an older format: rebuilding it")
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        shipped = None if from_scratch else shipped_record(family.name, seed)
        if shipped is not None and shipped["marker"] == wanted:
            _install_into(staging, seed, family, shipped, log)
        else:
            _build_into(staging, seed, steps, measure_prompts, log, target_pass_rate, probe_from, probe_every,
                        verbose, family)
        (staging / MARKER).write_text(json.dumps(wanted) + "\n")  # last: the build is complete
        staging.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        recorded = _marker(target)
        if recorded is not None and not force and recorded.get("format") == BUILD_FORMAT:  # a concurrent build won
            shutil.rmtree(staging)
            return _cached(target, recorded, wanted, log)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"tiny build written to {target}")
    return target


def _cached(target: Path, recorded: dict, wanted: dict, log: Callable[[str], None]) -> Path:
    """A complete build at `target` (its marker `recorded`), after checking it was built as `wanted`."""
    if recorded != wanted:
        raise ValueError(f"{target} holds a tiny build made with {recorded}, not {wanted}; "
                         "rebuild it with force=True (pcl make-tiny --force) or choose another directory")
    log(f"tiny build for seed {wanted['seed']} already complete at {target}")
    return target


def _remove_stale_staging(target: Path, max_age_s: float = 3600.0) -> None:
    """Delete staging directories of builds of `target` that were killed (untouched for max_age_s)."""
    for staging in target.parent.glob(f".{target.name}.building-*"):
        if time.time() - staging.stat().st_mtime > max_age_s:
            shutil.rmtree(staging, ignore_errors=True)


def _probe_stop(model, tokenizer, rows: list[dict], seed: int, target_pass_rate: float | None, probe_from: int,
                probe_every: int, probes: list[dict], log: Callable[[str], None],
                response: Callable[[dict], str] = ARITH.response) -> Callable[[int], bool]:
    """warm_up's `stop`: on probe steps, the mean sampled pass rate of `rows` (appended to `probes`) against
    the target."""

    def stop(done: int) -> bool:
        if target_pass_rate is None or done < probe_from or (done - probe_from) % probe_every:
            return False
        with torch.random.fork_rng():  # the probe's sampling leaves the warm-up's generator alone
            rates = measure_pass_rates(model, tokenizer, rows, PROBE_SAMPLES, seed=seed, response=response)
        probes.append({"step": done, "pass_rate": round(sum(rates) / len(rates), 4)})
        log(f"  probe at step {done}: pass rate {probes[-1]['pass_rate']:.3f} (target {target_pass_rate})")
        return probes[-1]["pass_rate"] >= target_pass_rate

    return stop


def _generation_config(tokenizer):
    """What the saved policy samples with: the tokenizer's special tokens, temperature 1."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0,
    )


def _measure(model, tokenizer, rows: list[dict], seed: int, verbose: bool, response) -> list[float]:
    """Each row's pass rate over MEASURE_SAMPLES samples, with a progress bar."""
    with Progress(len(rows), "measuring pass rates", "prompt", lines=verbose,
                  terminal=None if verbose else False) as bar:
        return measure_pass_rates(model, tokenizer, rows, MEASURE_SAMPLES, seed=seed, progress=bar.update,
                                  response=response)


def _loss_figures(losses: list[float]) -> dict:
    """The warm-up's final loss (mean of the last 20 steps) and its mean loss by tenth of the steps taken."""
    tenth = math.ceil(len(losses) / 10)
    return {
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "loss_by_tenth": [round(sum(losses[i : i + tenth]) / len(losses[i : i + tenth]), 4)
                          for i in range(0, len(losses), tenth)],
    }


def _write_task_files(out: Path, seed: int, family: TinyTask) -> tuple[object, list[dict]]:
    """The tokenizer and the task's splits (cheap and deterministic); returns the tokenizer and the train rows."""
    tokenizer = build_tokenizer(family.symbols, family.max_positions)
    tokenizer.save_pretrained(out)
    train_rows = family.train_rows(TRAIN_SIZE, seed)
    _write_jsonl(out / "train.jsonl", train_rows)
    _write_jsonl(out / "eval.jsonl", family.eval_rows(EVAL_SIZE, seed))
    return tokenizer, train_rows


def _install_into(out: Path, seed: int, family: TinyTask, record: dict, log: Callable[[str], None]) -> None:
    """All of a build's files but the marker, with the shipped policy's weights (pcl.tiny.shipped) in place of
    the warm-up; report.json is the shipped build's, saying so."""
    from transformers import Qwen3ForCausalLM

    started = time.perf_counter()
    weights, _ = shipped_paths(family.name, seed)
    log(f"installing the shipped tiny policy {family.name!r} (seed {seed}, {weights.name}; "
        f"`pcl make-tiny --from-scratch` trains it instead)")
    tokenizer, _ = _write_task_files(out, seed, family)
    model = Qwen3ForCausalLM(policy_config(tokenizer, family.max_positions))
    missing, unexpected = model.load_state_dict(load_shipped_weights(family.name, seed, record), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the head is tied to the embedding: not in the file
        raise ValueError(f"{weights}: does not fit the tiny policy (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
    model.generation_config = _generation_config(tokenizer)
    _save_quietly(model.eval(), out)
    report = {**record["report"], "installed_from": f"pcl/tiny/shipped/{weights.name}",
              "built_on": record["machine"]}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    measured = "\n".join(format_report(report).splitlines()[:-1])  # its last line times the original build
    log(f"{measured}\n(measured when the shipped policy was built, on {record['machine']['cpu'] or '?'}; "
        f"installed here in {time.perf_counter() - started:.1f}s)")


def _build_into(out: Path, seed: int, steps: int, measure_prompts: int, log: Callable[[str], None],
                target_pass_rate: float | None, probe_from: int, probe_every: int, verbose: bool = False,
                family: TinyTask = ARITH) -> None:
    """All of a build's files but the marker."""
    from transformers import Qwen3ForCausalLM

    started, cpu_started = time.perf_counter(), time.process_time()
    log(f"building the tiny task {family.name!r} and its policy (seed {seed}, up to {steps} warm-up steps, "
        f"{BUILD_THREADS} thread)")
    tokenizer, train_rows = _write_task_files(out, seed, family)
    decay_steps = min(steps, family.decay_steps)
    warmup_rows = family.warmup_rows(max(TRAIN_SIZE, decay_steps * WARMUP_BATCH), seed)
    with deterministic_cpu(BUILD_THREADS):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(policy_config(tokenizer, family.max_positions))
        log(f"policy: Qwen3, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")
        input_ids, labels = encode_for_training(warmup_rows, tokenizer, family.response)
        # A seeded shuffle, so batches mix levels and the train.jsonl rows are spread through the run.
        order = torch.randperm(input_ids.shape[0], generator=torch.Generator().manual_seed(seed))
        probes: list[dict] = []
        stop = _probe_stop(model, tokenizer, train_rows[:PROBE_PROMPTS], seed, target_pass_rate, probe_from,
                           probe_every, probes, log, family.response)
        warm_started = time.perf_counter()
        losses = warm_up(model, input_ids[order], labels[order], steps, WARMUP_BATCH, WARMUP_LR, log, stop,
                         decay_steps)
        warmup_seconds = time.perf_counter() - warm_started
        model.generation_config = _generation_config(tokenizer)
        _save_quietly(model, out)
        log(f"measuring pass rates: {MEASURE_SAMPLES} samples x {measure_prompts} training prompts")
        measure_started = time.perf_counter()
        rates = _measure(model, tokenizer, train_rows[:measure_prompts], seed, verbose, family.response)
        measure_seconds = time.perf_counter() - measure_started
    summary = summarize(rates, [r["difficulty"] for r in train_rows[:measure_prompts]], family.level_name)
    report = {
        "task": family.name, "seed": seed, "warmup_steps": steps, "warmup_steps_taken": len(losses),
        "warmup_batch": WARMUP_BATCH,
        "warmup_lr": WARMUP_LR, "warmup_decay_steps": decay_steps, "target_pass_rate": target_pass_rate,
        "probes": probes,
        "parameters": sum(p.numel() for p in model.parameters()),
        **_loss_figures(losses),
        "pass_rates": summary,
        "warmup_seconds": round(warmup_seconds, 2), "measure_seconds": round(measure_seconds, 2),
        "build_seconds": round(time.perf_counter() - started, 2),
        # On a busy machine wall time inflates; CPU seconds (one thread) estimate the time on an idle core.
        "cpu_seconds": round(time.process_time() - cpu_started, 2),
        "load_average": round(os.getloadavg()[0], 2),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(format_report(report))
