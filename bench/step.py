"""Seconds per training step of this system against TRL's GRPOTrainer, on the tiny task, side by side.

    python -m bench.step                       # TRL (2 and 1 threads), ours (uniform), ours (pcl): ~4 min
    python -m bench.step --rounds 2            # two alternating rounds of TRL and ours (uniform), pooled
    python -m bench.step --model DIR           # another policy checkpoint (a Hugging Face directory)
    python -m bench.step --ours rollout.max_in_flight=16   # try a config change on our side

Both trainers start from the same policy checkpoint (the built tiny model when its build is complete, else
a shorter warm-up of the same build, cached) and do the same work per optimizer step: m prompts x n
samples of at most `max_new_tokens` tokens at temperature 1, rewards from `pcl.reward.verdict.math_reward` (0 when
truncated), group-mean advantages without std scaling, no KL, and one on-policy AdamW step whose loss is
normalised per sequence length (algorithm steps 5-7; TRL: beta=0, scale_rewards="none", loss_type="grpo",
num_iterations=1, one generation batch of m*n completions per optimizer step, no gradient checkpointing).
Each trainer runs in its own subprocess, never two at once: TRL as one process with 2 torch threads (and
again with 1: on a shared 2-core machine its 2 OpenMP threads stall whenever a core is taken, see the doc),
ours as `configs/tiny.yaml` places its actors (local Ray on 2 CPUs; 2 threads for the rollout worker, which
generates while the learner ranks wait, 1 for the others). The first `--warmup` steps of every run are not
counted; the steps after them are pooled over the rounds. TRL's step is timed
by a TrainerCallback (on_step_begin -> on_step_end); ours is the coordinator's `step_seconds` in
RUN_DIR/metrics.jsonl. The last line ends with the ratio ours (uniform) / TRL of the median steady-state
seconds per step, against the faster of the TRL columns. Results and caveats: docs/results/bench-step.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import ROOT, add_json_option, write_figures

CONFIG = ROOT / "configs" / "tiny.yaml"
OUR_PARTS = ("selection_seconds", "generation_seconds", "train_seconds", "weight_sync_seconds")
PER_STEP = ("step_seconds", "rollout_seconds", "reward_seconds", "effective_ratio", *OUR_PARTS)
PER_CYCLE = ("cycle_seconds", "cycle_cpu_seconds")  # end of step k -> end of step k+1
STANDIN_WARMUP_STEPS = 400  # mean sampled pass rate ~0.2, ~40% of prompts in [0.1, 0.9]
OURS = "ours uniform"


# ---------------------------------------------------------------------------------------------------------
# The shared checkpoint


def policy_checkpoint(requested: str | None) -> tuple[str, str]:
    """(directory, description) of the policy both trainers start from.

    Without the built tiny model, a shorter warm-up of the same build stands in (cached beside it). Random
    weights would not do: they solve nothing, every advantage is 0, and our learner skips zero-advantage
    sequences (exact for this loss) while TRL still runs them, which would flatter us.
    """
    from pcl.tiny.build import build_tiny, cache_root, is_complete, tiny_dir

    if requested:
        return requested, f"given checkpoint {requested}"
    if is_complete(tiny_dir(0)):
        return str(tiny_dir(0)), f"the built tiny model ({tiny_dir(0)})"
    standin = cache_root() / "bench" / "step-standin-seed-0"
    if not is_complete(standin):
        print(f"building a stand-in policy ({STANDIN_WARMUP_STEPS} warm-up steps, ~3 min on 2 busy cores)", flush=True)
    build_tiny(seed=0, out_dir=standin, steps=STANDIN_WARMUP_STEPS, measure_prompts=128)
    rates = json.loads((standin / "report.json").read_text())["pass_rates"]
    return str(standin), (f"stand-in: the tiny build with {STANDIN_WARMUP_STEPS} warm-up steps ({standin}; mean "
                          f"pass rate {rates['mean']:.2f}, {rates['intermediate_share']:.0%} of prompts in [0.1, 0.9])")


class TreeCpu(threading.Thread):
    """CPU seconds (user + system) of this process and all its descendants (Ray's processes, every actor,
    Redis), read whenever the run's metrics file gains a step line: CPU per step, which other users of the
    machine inflate far less than wall time."""

    def __init__(self, metrics: Path):
        super().__init__(daemon=True)
        self.metrics, self.marks, self.stop = metrics, [], threading.Event()

    def total(self) -> float:
        import psutil

        me, seconds = psutil.Process(), 0.0
        for proc in [me, *me.children(recursive=True)]:
            try:  # children_*: descendants that already exited and were reaped
                t = proc.cpu_times()
                seconds += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:  # exited between the listing and the read
                pass
        return seconds

    def run(self) -> None:
        while not self.stop.wait(0.2):
            lines = self.metrics.read_text().count("\n") if self.metrics.exists() else 0
            if lines > len(self.marks):
                self.marks.extend([self.total()] * (lines - len(self.marks)))


# ---------------------------------------------------------------------------------------------------------
# Child: TRL


def trl_reward(max_new_tokens: int, eos_id: int, seconds: list[float]):
    """pcl.reward.verdict.math_reward as a TRL reward function; a truncated response scores 0 (algorithm step 5).
    Each call's wall time is appended to `seconds`."""
    from pcl.reward.verdict import response_reward

    def finish_reason(ids) -> str:  # TRL gives token ids, not the engine's finish reason
        return "length" if len(ids) >= max_new_tokens and ids[-1] != eos_id else "stop"

    def math_verify_reward(prompts, completions, completion_ids, answer, **_) -> list[float]:
        start = time.perf_counter()
        rewards = [response_reward(finish_reason(ids), text, gold)
                   for text, ids, gold in zip(completions, completion_ids, answer)]
        seconds.append(time.perf_counter() - start)
        return rewards

    return math_verify_reward


def run_trl(args: argparse.Namespace) -> dict:
    """Train `steps` GRPOTrainer steps on the tiny task; per-step wall times from a callback."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pcl.config import load_config
    from pcl.data.inputs import load_tokenizer
    from pcl.tiny.task import format_prompt, make_dataset

    torch.set_num_threads(args.trl_threads[0])
    cfg = load_config(CONFIG)
    m, n, max_new = cfg.run.m, cfg.run.n, cfg.rollout.max_new_tokens
    rows = make_dataset(cfg.data.tiny_size, cfg.run.seed, "train")
    data = Dataset.from_list([{"prompt": format_prompt(r["problem"]), "answer": r["answer"]} for r in rows])
    tokenizer = load_tokenizer(cfg, args.model)  # as our side loads it
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=str(Path(args.out).parent / "trl-out"), max_steps=args.steps, seed=cfg.run.seed,
        per_device_train_batch_size=m * n, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=n, max_completion_length=max_new, temperature=cfg.rollout.temperature, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, scale_rewards="none", loss_type="grpo", mask_truncated_completions=False,
        learning_rate=cfg.optimizer.lr, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=cfg.optimizer.beta1, adam_beta2=cfg.optimizer.beta2, adam_epsilon=cfg.optimizer.eps,
        weight_decay=cfg.optimizer.weight_decay, max_grad_norm=cfg.optimizer.grad_clip or 0.0,
        use_cpu=True, bf16=False, fp16=False, use_vllm=False, gradient_checkpointing=False, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )

    class StepClock(TrainerCallback):
        """Wall time of each optimizer step (generation, rewards and the update all happen inside it)."""

        def __init__(self) -> None:
            self.begin, self.steps, self.ends, self.cpu = 0.0, [], [], []

        def on_step_begin(self, *_, **__):
            self.begin = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())
            self.cpu.append(time.process_time())
            self.steps.append(self.ends[-1] - self.begin)

    clock, reward_times = StepClock(), []
    started = time.perf_counter()
    reward = trl_reward(max_new, tokenizer.eos_token_id, reward_times)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                          train_dataset=data, processing_class=tokenizer, callbacks=[clock])
    rollout_times: list[float] = []
    effective: list[float] = []  # share of non-zero advantages (docs/architecture.md)
    score = trainer._generate_and_score_completions  # generation + rewards + advantages, timed apart

    def timed_score(*a, **kw):
        t = time.perf_counter()
        out = score(*a, **kw)
        rollout_times.append(time.perf_counter() - t)
        effective.append(float((out["advantages"].abs() > 1e-6).float().mean()))
        return out

    trainer._generate_and_score_completions = timed_score
    startup = time.perf_counter() - started
    trainer.train()
    return {"step_seconds": clock.steps, "rollout_seconds": rollout_times, "startup_seconds": startup,
            "effective_ratio": effective, "reward_seconds": reward_times,
            "cycle_seconds": [b - a for a, b in zip(clock.ends, clock.ends[1:])],
            "cycle_cpu_seconds": [b - a for a, b in zip(clock.cpu, clock.cpu[1:])],
            "versions": {"trl": _version("trl"), "transformers": _version("transformers"), "torch": torch.__version__}}


# ---------------------------------------------------------------------------------------------------------
# Child: ours


def run_ours(args: argparse.Namespace) -> dict:
    """`pcl train configs/tiny.yaml` for `steps` steps with the given strategy; per-step times from metrics."""
    from pcl.config import load_config
    from pcl.loop.runlog import read_metrics
    from entrypoints.train import run_training

    run_dir = Path(args.out).with_suffix(".run")  # fresh per run: a run dir that holds metrics is refused
    overrides = [f"run.steps={args.steps}", "run.eval_every=0", "run.time_budget_s=null",
                 f"selection.type={args.selection}", f"model.path={args.model}", f"value.path={args.model}",
                 *args.ours]
    cpu = TreeCpu(run_dir / "metrics.jsonl")
    cpu.start()
    started = time.perf_counter()
    if run_training(load_config(CONFIG, overrides), run_dir=str(run_dir)) != 0:
        raise RuntimeError(f"training failed; see {run_dir}")
    total = time.perf_counter() - started
    cpu.stop.set()
    cpu.join()
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "step_seconds" in r]
    summary = json.loads((run_dir / "summary.json").read_text())
    out = {key: [r[key] for r in records] for key in ("step_seconds", *OUR_PARTS)}
    elapsed = [r["elapsed_seconds"] for r in records]
    out["cycle_seconds"] = [b - a for a, b in zip(elapsed, elapsed[1:])]
    out["cycle_cpu_seconds"] = [b - a for a, b in zip(cpu.marks, cpu.marks[1:])]
    out["effective_ratio"] = [r["effective_ratio"] for r in records]
    out["startup_seconds"] = total - summary["seconds"]  # driver, Redis, Ray and every actor up
    out["engine_seconds"] = engine_reference(args.model, load_config(CONFIG, overrides))
    return out


def engine_reference(model: str, cfg) -> float:
    """The bare HF engine's time for one step's m x n samples in this process with the rollout worker's
    threads (`rollout.threads`; median of 3): generation_seconds minus this is what the streams, the verifier
    and the rollout loop add."""
    import torch

    from pcl.data.inputs import load_tokenizer, training_prompts
    from pcl.engines import SamplingParams, make_engine

    torch.set_num_threads(cfg.rollout.threads)
    prompts, _ = training_prompts(cfg, load_tokenizer(cfg, model))
    engine = make_engine(cfg.rollout, model, seed=0, dtype="float32", device="cpu")
    params = SamplingParams.from_rollout_config(cfg.rollout, n=cfg.run.n)
    times = []
    for rep in range(3):
        batch = [list(p.prompt_token_ids) for p in prompts[rep * cfg.run.m:(rep + 1) * cfg.run.m]]
        start = time.perf_counter()
        engine.generate(batch, params)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# ---------------------------------------------------------------------------------------------------------
# Parent: run the children, print the comparison


def run_child(kind: str, args: argparse.Namespace, model: str, scratch: Path, selection: str = "",
              threads: int = 1) -> dict:
    """Run one trainer in a subprocess; returns its result with the load average seen around it."""
    out = Path(tempfile.mkstemp(prefix=f"{kind}-{selection or threads}-", suffix=".json", dir=scratch)[1])
    cmd = [sys.executable, "-m", "bench.step", "--child", kind, "--model", model, "--steps", str(args.steps),
           "--trl-threads", str(threads), "--out", str(out), "--selection", selection or "uniform",
           *(f"--ours={o}" for o in args.ours)]
    env = dict(os.environ)
    if kind == "trl":  # one process, `threads` intra-op threads; ours pins each actor itself
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    load_before, started = os.getloadavg()[0], time.perf_counter()
    log = out.with_suffix(".log")
    with log.open("w") as handle:
        code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        sys.exit(f"bench.step: the {kind} {selection} run failed (exit {code}); its log: {log}\n{tail}")
    result = json.loads(out.read_text())
    result.update(load=(load_before, os.getloadavg()[0]), wall_seconds=time.perf_counter() - started)
    steps = ", ".join(f"{x:.2f}" for x in result["step_seconds"])
    print(f"  {kind} {selection or f'{threads} thread(s)'}: {result['wall_seconds']:.0f}s wall; s/step: {steps}",
          flush=True)
    return result


def pool(runs: list[dict], warmup: int) -> dict:
    """The runs of one column as one: per-step lists without each run's warm-up steps, concatenated."""
    out: dict = {}
    for key in PER_STEP + PER_CYCLE:
        skip = warmup if key in PER_STEP else max(0, warmup - 1)
        if key in runs[0]:
            out[key] = [x for r in runs for x in r[key][skip:]]
    if not out["step_seconds"]:
        sys.exit(f"bench.step: no steps after the {warmup} warm-up steps; raise --steps")
    out["startup_seconds"] = statistics.mean(r["startup_seconds"] for r in runs)
    out["engine_seconds"] = statistics.median(r.get("engine_seconds", float("nan")) for r in runs)
    out["load"] = (min(r["load"][0] for r in runs), max(r["load"][1] for r in runs))
    return out


def print_report(results: dict[str, dict]) -> dict:
    """The side-by-side table, then the breakdowns; the last line ends with the ratio."""
    med, avg = statistics.median, statistics.mean
    rows = [("s/step, median (headline)", lambda r: med(r["step_seconds"])),
            ("s/step, mean", lambda r: avg(r["step_seconds"])),
            ("s/step, min", lambda r: min(r["step_seconds"])),
            ("s/step incl. logging, mean", lambda r: avg(r["cycle_seconds"])),
            ("CPU s/step, all processes", lambda r: avg(r["cycle_cpu_seconds"])),
            ("effective ratio, mean", lambda r: avg(r["effective_ratio"])),
            ("steps counted", lambda r: len(r["step_seconds"])),
            ("start-up s (before step 1)", lambda r: r["startup_seconds"])]
    print(f"\n{'':28s}" + "".join(f"{c:>15s}" for c in results))
    for name, fn in rows:
        print(f"{name:28s}" + "".join(f"{fn(r):15.3f}" for r in results.values()))
    print(f"{'load average before/after':28s}" + "".join(f"{f'{a:.1f}/{b:.1f}':>15s}" for a, b in
                                                       (r["load"] for r in results.values())))
    trls = [c for c in results if c.startswith("TRL")]
    for col in trls:
        r = results[col]
        step, roll, reward = (avg(r[k]) for k in ("step_seconds", "rollout_seconds", "reward_seconds"))
        print_parts(col, step, [("generation (model.generate)", roll - reward),
                                ("rewards (math_reward in-process)", reward),
                                ("loss + backward + optimizer + logging", step - roll)])
    for col in [c for c in results if not c.startswith("TRL")]:
        print_breakdown(col, results[col])
    best = min(trls, key=lambda c: med(results[c]["step_seconds"]))  # the harder target of the two
    ours = results[OURS]["step_seconds"]
    theirs = results[best]["step_seconds"]
    print(f"\nleast-contended steps (min s/step): ours (uniform) {min(ours):.3f}, {best} {min(theirs):.3f}; "
          f"ratio {min(ours) / min(theirs):.2f}")
    print(f"median steady-state s/step: ours (uniform) {med(ours):.3f}, {best} (the faster TRL) "
          f"{med(theirs):.3f}; step-time ratio ours/TRL: {med(ours) / med(theirs):.2f}")
    return {"columns": {col: {"median_step_seconds": med(r["step_seconds"]), "mean_step_seconds": avg(r["step_seconds"]),
                              "min_step_seconds": min(r["step_seconds"]), "steps": len(r["step_seconds"]),
                              "startup_seconds": r["startup_seconds"]} for col, r in results.items()},
            "faster_trl": best, "ratio_ours_over_trl": med(ours) / med(theirs)}


def print_parts(col: str, step: float, parts: list[tuple[str, float]]) -> None:
    print(f"\n{col} breakdown (mean s/step, share of step):")
    for name, value in parts:
        print(f"  {name:60s} {value:7.3f}  {value / step:6.1%}")


def print_breakdown(col: str, r: dict) -> None:
    """Where one of our columns spends its step, from the coordinator's timers."""
    step = statistics.mean(r["step_seconds"])
    parts = {k: statistics.mean(r[k]) for k in OUR_PARTS}
    print_parts(col, step, [
        ("generation incl. verification and queues", parts["generation_seconds"]),
        ("  the bare HF engine alone (rollout.threads, measured apart)", r["engine_seconds"]),
        ("  streams + verifier + rollout loop (the difference)", parts["generation_seconds"] - r["engine_seconds"]),
        ("selection (sample + score V + select)", parts["selection_seconds"]),
        ("learner (policy step, 2 FSDP2 ranks; + V step for pcl)", parts["train_seconds"]),
        ("weight sync (learner -> rollout worker)", parts["weight_sync_seconds"]),
        ("other (coordinator bookkeeping)", step - sum(parts.values()))])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps per run (default 12)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run not counted (default 2)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of TRL and ours (uniform) runs (default 1)")
    parser.add_argument("--trl-threads", type=int, nargs="+", default=[2, 1],
                        help="a TRL column per torch thread count (default: 2 1)")
    parser.add_argument("--model", default=None, help="policy checkpoint; the built tiny model by default")
    parser.add_argument("--no-pcl", action="store_true", help="skip the PCL column")
    parser.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra config override for our runs (repeatable)")
    parser.add_argument("--child", choices=("trl", "ours"), help=argparse.SUPPRESS)
    parser.add_argument("--selection", default="uniform", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.steps <= args.warmup + 1 or args.rounds < 1 or min(args.trl_threads) < 1:
        parser.error(f"--steps ({args.steps}) must exceed --warmup + 1; --rounds and --trl-threads must be >= 1")
    if args.child:
        result = run_trl(args) if args.child == "trl" else run_ours(args)
        Path(args.out).write_text(json.dumps(result))
        return result
    scratch = Path(tempfile.mkdtemp(prefix="pcl-bench-step-"))  # kept when a run fails, for its log
    model, described = policy_checkpoint(args.model)
    print(f"policy: {described}\n{args.steps} steps per run, first {args.warmup} not counted; {args.rounds} "
          f"round(s); {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
          + (f"; our overrides: {' '.join(args.ours)}" if args.ours else ""), flush=True)
    runs: dict[str, list[dict]] = {f"TRL {t} thr": [] for t in args.trl_threads} | {OURS: []}
    for _ in range(args.rounds):
        for t in args.trl_threads:
            runs[f"TRL {t} thr"].append(run_child("trl", args, model, scratch, threads=t))
        runs[OURS].append(run_child("ours", args, model, scratch, "uniform"))
    if not args.no_pcl:
        runs["ours pcl"] = [run_child("ours", args, model, scratch, "pcl")]
    figures = print_report({col: pool(rs, args.warmup) for col, rs in runs.items()})
    shutil.rmtree(scratch, ignore_errors=True)
    return write_figures(args.json, {"policy": described, "steps": args.steps, "warmup": args.warmup,
                                     "rounds": args.rounds, **figures})


if __name__ == "__main__":
    main()
