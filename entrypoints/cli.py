"""The `pcl` command line. Each subcommand parses its arguments and imports what it needs late, so that
`pcl --help` returns at once.

    pcl make-tiny [--seed 0] [--out DIR] [--task tiny|tiny-carry]   build a tiny task and its warm-started model
    pcl train CONFIG [MORE.yaml ...] [--run-dir DIR] [--resume [DIR]] [key=value ...]
    pcl control --redis-url URL (--run NAME | --config CONFIG) [key=value ...]   serve a run's control plane
    pcl status [--url URL] [--json]                        a run's status, as a table
    pcl probe-batch CONFIG [--sizes B,...] [--repeats R] [key=value ...]   generation time over batch sizes
    pcl experiment CONFIG [--report-only]                   a strategy comparison and its report
    pcl summary RUN_DIR ... [--plot [PNG]]                  runs' headline figures side by side
    pcl plot RUN_DIR ... [--out PNG] [--labels a,b]         runs' curves overlaid in one PNG
    pcl eval --model PATH|tiny [--suite math500,aime24,...] [--k 32|aime24=8,...] [--limit N] [--out DIR]
             [--temperature 0.6 --top-p 0.95 --top-k 20] [--template qwen_base] [--engine auto|hf|vllm]
                                                           avg@k per benchmark: a table, eval.json, eval.md
    pcl export RUN_DIR|CHECKPOINT|MODEL_DIR --out DIR       the policy in Hugging Face format
"""

from __future__ import annotations

import argparse
import os
import sys


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    from pcl.tiny.build import build_tiny

    build_tiny(seed=args.seed, out_dir=args.out, force=args.force, verbose=True, task=args.task)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from pcl.config import load_config

    if args.resume and "=" in args.resume and not os.path.exists(args.resume):
        # `--resume key=value`: the optional DIR took an override; it means `--resume` and that override
        args.overrides, args.resume = [args.resume, *args.overrides], ""
    cfg = load_config(*_config_files(args))
    from entrypoints.train import run_training

    return run_training(cfg, run_dir=args.run_dir, resume=args.resume)


def _cmd_eval(args: argparse.Namespace) -> int:
    import importlib.util
    import time
    from pathlib import Path

    from pcl import evaluation as ev
    from pcl.config import ConfigError, RolloutConfig

    try:
        names = ev.parse_suite(args.suite)
        ks = ev.parse_k(args.k, names)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens),
                        ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: expected an integer >= 1")
    engine_name = ev.pick_engine(args.engine)
    if engine_name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("--engine vllm: vLLM is not installed (pip install 'pcl-service[gpu]'); use --engine hf")
    from entrypoints.train import resolve_model_path

    model = resolve_model_path(args.model, "--model")
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--model {args.model!r}: its tokenizer could not be loaded ({exc})") from None
    root = ev.eval_data_root(args.data_root)
    try:
        suite = ev.load_suite(names, tokenizer, args.template, root=root, limit=args.limit)
    except (ValueError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    context = getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", None)
    longest = max(len(r.prompt_token_ids) for records in suite.values() for r in records) + args.max_new_tokens
    if context and longest > context:
        print(f"pcl: warning: the longest prompt plus --max-new-tokens is {longest} tokens, beyond the model's "
              f"context ({context} positions)", file=sys.stderr)
    from pcl.engines import make_engine
    from pcl.reward_pool import RewardPool

    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    batch_size = args.batch_size or (256 if engine_name == "hf" else 1 << 16)  # vLLM schedules its own batches
    extra = {"max_batch_size": batch_size} if engine_name == "hf" else {}
    try:
        from pcl.engines.base import SamplingParams

        SamplingParams(n=1, max_new_tokens=args.max_new_tokens, **sampling)  # bad decoding flags fail here
        engine = make_engine(RolloutConfig(engine=engine_name, gpu_memory_utilization=0.9), model, args.seed,
                             dtype=args.dtype, device=args.device, **extra)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    start = time.perf_counter()
    with engine, RewardPool(processes=args.verifier_processes, timeout_s=args.verifier_timeout) as pool:
        results = ev.evaluate(engine, pool, suite, ks, sampling, args.max_new_tokens, seed=args.seed,
                              batch_size=batch_size)
    out = Path(args.out) if args.out else ev.default_out_dir(args.model, model)
    meta = {"model": args.model, "model_path": model, "engine": engine_name, "template": args.template, **sampling,
            "max_new_tokens": args.max_new_tokens, "limit": args.limit, "seed": args.seed, "data_root": root,
            "seconds": round(time.perf_counter() - start, 1)}
    paths = ev.write_reports(results, out, meta)
    print(ev.format_table(results))
    print(f"pcl: wrote {paths[0]} and {paths[1]}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    import json

    from pcl.config import ConfigError
    from pcl.export import export_policy

    try:
        out = export_policy(args.source, args.out)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    meta = json.loads((out / "export.json").read_text())
    step = "" if meta["step"] is None else f" of step {meta['step']}"
    print(f"pcl: exported the policy{step} ({meta['policy']}) to {out} (loadable with from_pretrained and by vLLM)")
    return 0


def _config_files(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """CONFIG plus further YAML files among the arguments (layered in order), and the key=value overrides."""
    files = [args.config] + [a for a in args.overrides if "=" not in a and a.endswith((".yaml", ".yml"))]
    return files, [a for a in args.overrides if a not in files]


def _cmd_config(args: argparse.Namespace) -> int:
    from pcl.config import dump_config, load_config, redacted

    print(dump_config(redacted(load_config(*_config_files(args)))), end="")  # the token and passwords hidden
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from pcl.runlog import summary_report

    try:
        print(summary_report(args.run_dirs))
    except FileNotFoundError as exc:
        print(f"pcl: {exc}", file=sys.stderr)
        return 2
    if args.plot is not None:
        from entrypoints.run_plot import plot_runs

        print(f"pcl: wrote {plot_runs(args.run_dirs, args.plot or None)}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from entrypoints.run_plot import plot_runs

    try:
        print(f"pcl: wrote {plot_runs(args.run_dirs, args.out, labels=args.labels)}")
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"pcl: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_control(args: argparse.Namespace) -> int:
    from pcl.config import ConfigError, load_config

    cfg = load_config(args.config, args.overrides)  # the defaults when no --config
    if not (args.run or args.config):
        raise ConfigError("pcl control needs --run NAME (the run's run.name) or --config CONFIG")
    url = args.redis_url or cfg.redis.url or os.environ.get("REDIS_URL")
    if not url:
        raise ConfigError("pcl control needs --redis-url (or REDIS_URL, or redis.url in --config)")
    from services.control_plane import serve_forever

    return serve_forever(cfg.control, url, args.run or cfg.run.name)


def _cmd_status(args: argparse.Namespace) -> int:
    import json

    from services.control_plane import fetch_status, format_status

    try:
        status = fetch_status(args.url)
    except OSError as exc:
        print(f"pcl: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0


def _cmd_probe_batch(args: argparse.Namespace) -> int:
    from pcl.config import ConfigError, load_config

    cfg = load_config(args.config, args.overrides)
    try:
        sizes = [int(b) for b in args.sizes.split(",")] if args.sizes else None
    except ValueError:
        raise ConfigError(f"--sizes {args.sizes!r}: expected comma-separated integers, e.g. 64,128,256") from None
    from entrypoints.probe_batch import probe_batch

    return probe_batch(cfg, sizes, args.repeats)


def _cmd_experiment(args: argparse.Namespace) -> int:
    from entrypoints.experiment import load_experiment, run_experiment

    if args.report_only:
        from entrypoints.experiment_report import write_report

        print(f"pcl: report written to {write_report(load_experiment(args.config))}")
        return 0
    return run_experiment(args.config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pcl", description="Prompt Curriculum Learning: RL post-training with value-model prompt selection.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a policy with the configured selection strategy")
    p.add_argument("config", help="YAML run config, e.g. configs/tiny.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. selection.tau=0.4")
    p.add_argument("--run-dir", help="where metrics.jsonl and checkpoints go (default runs/<run.name>)")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                   help="continue from the newest complete checkpoint (of DIR, or of the run dir)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("make-tiny", help="build the tiny synthetic task, tokenizer and warm-started model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output directory (default: the cache directory for the seed)")
    p.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    p.add_argument("--task", default="tiny", choices=["tiny", "tiny-carry"],
                   help="the task family: sums answered alone (tiny) or with a scratchpad (tiny-carry)")
    p.set_defaults(func=_cmd_make_tiny)

    p = sub.add_parser("summary", help="headline figures of finished or running runs, side by side")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--plot", nargs="?", const="", default=None, metavar="PNG",
                   help="also write the runs' curves to PNG (default: curves.png in the first run dir)")
    p.set_defaults(func=_cmd_summary)

    p = sub.add_parser("plot", help="a PNG of runs' curves: held-out accuracy, effective ratio, generation time, "
                       "train reward, V's explained variance")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="the PNG to write (default: curves.png in the first run dir)")
    p.add_argument("--labels", help="comma-separated legend labels, one per run (default: the run dirs' names)")
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser("control", help="serve a run's control plane (API, /metrics, dashboard) from its Redis")
    p.add_argument("--redis-url", help="the run's Redis (default: redis.url of --config, or REDIS_URL)")
    p.add_argument("--run", help="run name (run.name); default: that of --config")
    p.add_argument("--config", help="the run's YAML config, for run.name, redis.url and control.*")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. control.port=8601 control.host=0.0.0.0")
    p.set_defaults(func=_cmd_control)

    p = sub.add_parser("status", help="a running run's status, from its control plane, as a table")
    p.add_argument("--url", default=os.environ.get("PCL_CONTROL_URL", "http://127.0.0.1:8600"),
                   help="control plane URL (default $PCL_CONTROL_URL or http://127.0.0.1:8600)")
    p.add_argument("--json", action="store_true", help="print the raw JSON instead of a table")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("probe-batch", help="generation time over batch sizes b = m*n: the knee and the recommended b")
    p.add_argument("config", help="YAML run config (its fleet, model and run.n are used)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--sizes", help="comma-separated batch sizes b, multiples of run.n (default: 8n, 16n, ..., 1024n)")
    p.add_argument("--repeats", type=int, default=2, help="timed calls per size; the median counts (default 2)")
    p.set_defaults(func=_cmd_probe_batch)

    p = sub.add_parser("experiment", help="run a strategy comparison and write its report (table and plots)")
    p.add_argument("config", help="experiment config, e.g. configs/experiments/tiny-compare.yaml")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the runs already there")
    p.set_defaults(func=_cmd_experiment)

    p = sub.add_parser("eval", help="the paper's evaluation suite on a model: avg@k per benchmark")
    p.add_argument("--model", required=True, help="a Hugging Face model directory (an export, a checkpoint's "
                   "policy/), a hub name, or 'tiny' (the built tiny model)")
    p.add_argument("--suite", default="math500,aime24,aime25,amc23,minerva,olympiadbench",
                   help="comma-separated benchmarks (default: all six)")
    p.add_argument("--k", help="samples per prompt: one int for all, or name=k,... (default: the paper's: AIME and "
                   "AMC 32, Minerva 4, MATH500 and OlympiadBench 1)")
    p.add_argument("--limit", type=int, help="the first N prompts of each benchmark (smoke runs)")
    p.add_argument("--out", help="directory for eval.json and eval.md (default evals/<model name>)")
    p.add_argument("--data-root", help="local copies of the benchmarks (default $PCL_DATA_ROOT, else shared/data "
                   "beside the repository when present, else the Hugging Face hub)")
    p.add_argument("--template", default="qwen_base", choices=["qwen_base", "chat", "plain", "tiny"],
                   help="prompt template (default qwen_base, the paper's; chat for instruct models)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=20, help="-1 or 0 disables top-k (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=3072, help="response budget; a truncated response scores 0")
    p.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"],
                   help="auto: vLLM when installed and a GPU is visible, else Hugging Face transformers")
    p.add_argument("--batch-size", type=int, help="sequences (prompts x k) per generate call (default: 256 with hf, "
                   "a whole benchmark with vllm)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="hf engine only")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: float32 with hf, the checkpoint's with vllm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verifier-processes", type=int, default=2)
    p.add_argument("--verifier-timeout", type=float, default=5.0, help="seconds per response; a timeout scores 0")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("export", help="export a run's (or checkpoint's) policy in Hugging Face format")
    p.add_argument("source", help="a run directory (its newest complete checkpoint), a checkpoint directory, or a "
                   "Hugging Face model directory")
    p.add_argument("--out", required=True, help="an empty or new directory")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("config", help="print the resolved config (file + overrides) as YAML")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.set_defaults(func=_cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come after options (`pcl train cfg.yaml --run-dir d run.steps=3`): argparse leaves those
    # as unknown arguments, which are taken as overrides where the command has them.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if not hasattr(args, "overrides") or any(u.startswith("-") or "=" not in u for u in unknown):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.overrides = [*args.overrides, *unknown]
    from pcl.config import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"pcl: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if type(exc).__name__ != "RedisUnavailable":  # services.redis_server's, not imported for --help's sake
            raise
        print(f"pcl: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("pcl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
