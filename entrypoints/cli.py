"""The `pcl` command line. Each subcommand parses its arguments and imports what it needs late, so that
`pcl --help` returns at once.

    pcl make-tiny [--seed 0] [--out DIR] [--task tiny|tiny-carry] [--from-scratch]   a tiny task and its warm-started model
    pcl train CONFIG [MORE.yaml ...] [--run-dir DIR] [--resume [DIR]] [--ignore-plan] [--rehearse] [--local]
              [key=value ...]
    pcl control --redis-url URL (--run NAME | --config CONFIG) [key=value ...]   serve a run's control plane
    pcl status [--url URL] [--json]                        a run's status, as a table
    pcl probe-batch CONFIG [--sizes B,...] [--repeats R] [key=value ...]   generation time over batch sizes
    pcl experiment CONFIG [--report-only] [--set F=V]       a strategy comparison and its report
    pcl summary RUN_DIR ... [--plot [PNG]]                  runs' headline figures side by side
    pcl plot RUN_DIR ... [--out PNG] [--labels a,b]         runs' curves overlaid in one PNG
    pcl eval [CONFIG ...] [key=value ...] [--out DIR]       avg@k per benchmark of model.path (the evaluation section)
    pcl export RUN_DIR|CHECKPOINT|MODEL_DIR --out DIR       the policy in Hugging Face format
    pcl chaos CONFIG --seed S --faults N [--window S | --step-seconds S] [--out DIR] [--reference] [key=value ...]
                                                           a run under a seeded fault schedule; its invariants
    pcl chaos-check CONFIG [MORE.yaml ...] --run-dir DIR [key=value ...]
                                                           a finished run's invariants from its records and Redis
    pcl soak CONFIG [--minutes M] [--sample-seconds S] [--warmup S] [--out DIR] [--report-only] [key=value ...]
                                                           a long run sampled from outside: what grows, leaks or fills up
    pcl plan CONFIG [MORE.yaml ...] [--nodes N] [--gpus-per-node G] [--gpu-memory GB] [--headroom F] [--disk GB]
             [key=value ...]                               GPU memory per GPU of each role and the run's disk; exit 1
                                                           if it cannot fit
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from entrypoints.cli_args import config_files as _config_files
from entrypoints.cli_drills import add_drill_commands


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    from pcl.tiny.build import build_tiny

    path = build_tiny(seed=args.seed, out_dir=args.out, force=args.force, verbose=True, task=args.task,
                      from_scratch=args.from_scratch)
    if args.ship:  # maintainers: this build becomes the package's shipped policy (pcl/tiny/shipped)
        import json

        from pcl.tiny.build import MARKER
        from pcl.tiny.shipped import ship

        for written in ship(path, json.loads((path / MARKER).read_text())):
            print(f"wrote {written}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from pcl.config import load_config

    if args.resume and "=" in args.resume and not os.path.exists(args.resume):
        # `--resume key=value`: the optional DIR took an override; it means `--resume` and that override
        args.overrides, args.resume = [args.resume, *args.overrides], ""
    cfg = load_config(*_config_files(args))
    if args.rehearse:  # the config's layout for 2 steps on CPU with the tiny model (entrypoints/rehearse.py)
        from entrypoints.rehearse import rehearse

        return rehearse(cfg, run_dir=args.run_dir, local=args.local)
    if args.local:  # one process, one device: `pcl plan` plans a fleet's GPUs, so it is not asked here
        from entrypoints.local import run_local

        return run_local(cfg, run_dir=args.run_dir, resume=args.resume)
    _check_plan(cfg, args.ignore_plan)
    from entrypoints.train import run_training

    return run_training(cfg, run_dir=args.run_dir, resume=args.resume)


def _check_plan(cfg, ignore: bool) -> None:
    """Refuse a GPU config that `pcl plan` says does not fit (ConfigError), unless `ignore`: then log it."""
    from pcl.config import ConfigError
    from pcl.tools.plan import plan_refusal

    problem = plan_refusal(cfg)
    if problem is None:
        return
    if not ignore:
        raise ConfigError(problem)
    logging.getLogger("pcl.train").warning("--ignore-plan: training although %s", problem.split("\nchange")[0])


def _cmd_eval(args: argparse.Namespace) -> int:
    from entrypoints.evaluate import run_eval
    from pcl.config import load_config

    return run_eval(load_config(*_config_files(args)), args.out)


def _cmd_export(args: argparse.Namespace) -> int:
    import json

    from pcl.config import ConfigError
    from pcl.models.export import export_policy

    try:
        out = export_policy(args.source, args.out)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    meta = json.loads((out / "export.json").read_text())
    step = "" if meta["step"] is None else f" of step {meta['step']}"
    print(f"pcl: exported the policy{step} ({meta['policy']}) to {out} (loadable with from_pretrained and by vLLM)")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from pcl.config import dump_config, load_config, redacted

    print(dump_config(redacted(load_config(*_config_files(args)))), end="")  # the token and passwords hidden
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from pcl.config import ConfigError, load_config
    from pcl.tools.plan import PlanError, plan_run

    files, overrides = _config_files(args)
    flags = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "gpu_memory_gb": args.gpu_memory,
             "headroom": args.headroom, "disk_gb": args.disk}  # the flags win over the config's cluster section
    cfg = load_config(files, overrides + [f"cluster.{k}={v}" for k, v in flags.items() if v is not None])
    try:
        plan = plan_run(cfg)
    except PlanError as exc:
        raise ConfigError(str(exc)) from None
    print(plan.table())
    return 1 if plan.shortfalls else 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from pcl.loop.runlog import summary_report

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
    url = args.redis_url or cfg.redis.url  # redis.url: REDIS_URL when the config leaves it unset (pcl.config)
    if not url:
        raise ConfigError("pcl control needs --redis-url (or REDIS_URL, or redis.url in --config)")
    from actors.runtime import limit_malloc_arenas
    from services.control.server import serve_forever

    limit_malloc_arenas()  # a control plane's request threads come and go for days, as in pcl train's driver
    return serve_forever(cfg.control, url, args.run or cfg.run.name)


def _cmd_status(args: argparse.Namespace) -> int:
    import json

    from services.control.server import fetch_status, format_status

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

        print(f"pcl: report written to {write_report(load_experiment(args.config, args.set))}")
        return 0
    return run_experiment(args.config, args.set)


EVAL_HELP = """The paper's evaluation suite on model.path: avg@k per benchmark (a table, eval.json, eval.md).

Configured like `pcl train`: a run config (none: the defaults; several YAML files are layered) and dotted
key=value overrides; `pcl config CONFIG key=value ...` prints what it resolves to. Every default is the config's:
  model.path                    a Hugging Face model directory (an export, a checkpoint's policy/), a hub name,
                                or tiny (the built tiny model); model.dtype, model.device (hf engine)
  evaluation.suite              benchmarks: math500, aime24, aime25, amc23, minerva, olympiadbench (empty: all six)
  evaluation.k                  {name: k}; the paper's k for those not named
  evaluation.limit              the first N prompts of each benchmark (smoke runs)
  evaluation.temperature, evaluation.top_p, evaluation.top_k      the decoding (top_k -1: off)
  evaluation.max_new_tokens     the response budget (unset: rollout.max_new_tokens); a truncated response scores 0
  data.template, data.root      the prompt template; local copies of the benchmarks (else $PCL_DATA_ROOT, else
                                shared/data beside the repository, else the hub)
  rollout.engine                hf or vllm; verifier.processes, verifier.timeout_s; run.seed

  pcl eval model.path=runs/q4b/checkpoints/step-000200/policy
  pcl eval runs/q4b/config.yaml model.path=runs/q4b/checkpoints/step-000200/policy --out evals/q4b-200
  pcl eval configs/presets/qwen3-4b-base-math.yaml model.path=exports/q4b "evaluation.k={aime24: 64}"
"""


def _add_training_commands(sub) -> None:
    p = sub.add_parser("train", help="train a policy with the configured selection strategy")
    p.add_argument("config", help="YAML run config, e.g. configs/tiny.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. selection.tau=0.4")
    p.add_argument("--run-dir", help="where metrics.jsonl and checkpoints go (default runs/<run.name>)")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                   help="continue from the newest complete checkpoint (of DIR, or of the run dir)")
    p.add_argument("--ignore-plan", action="store_true",
                   help="train even when `pcl plan` says the config does not fit its GPUs (logged)")
    p.add_argument("--rehearse", action="store_true",
                   help="run the config's layout for 2 steps on CPU with the tiny model and lengths; PASS or FAIL")
    p.add_argument("--local", action="store_true",
                   help="run in this process on one device (the CPU or one GPU), without Ray: ranks and workers "
                   "map to one (entrypoints/local.py)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("make-tiny", help="build the tiny synthetic task, tokenizer and warm-started model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output directory (default: the cache directory for the seed)")
    p.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    p.add_argument("--from-scratch", action="store_true",
                   help="train the policy here (minutes, one thread) instead of installing the policy shipped in "
                        "the package for this task and seed (pcl/tiny/shipped)")
    p.add_argument("--ship", action="store_true",
                   help="write the build's weights and record into pcl/tiny/shipped (with --from-scratch: maintainers)")
    p.add_argument("--task", default="tiny", choices=["tiny", "tiny-carry"],
                   help="the task family: sums answered alone (tiny) or with a scratchpad (tiny-carry)")
    p.set_defaults(func=_cmd_make_tiny)

    p = sub.add_parser("probe-batch", help="generation time over batch sizes b = m*n: the knee and the recommended b")
    p.add_argument("config", help="YAML run config (its fleet, model and run.n are used)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--sizes", help="comma-separated batch sizes b, multiples of run.n (default: 8n, 16n, ..., 1024n)")
    p.add_argument("--repeats", type=int, default=2, help="timed calls per size; the median counts (default 2)")
    p.set_defaults(func=_cmd_probe_batch)

    p = sub.add_parser("experiment", help="run a strategy comparison and write its report (table and plots)")
    p.add_argument("config", help="experiment config, e.g. configs/experiments/tiny-compare.yaml")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the runs already there")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="replace a top-level field of the experiment config (the value read as YAML), e.g. a short "
                   "try: --set budget_s=20 --set seeds=[0] --set runs_dir=/tmp/exp --set output=/tmp/exp.md")
    p.set_defaults(func=_cmd_experiment)

    p = sub.add_parser("config", help="print the resolved config (file + overrides) as YAML")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.set_defaults(func=_cmd_config)


def _add_run_commands(sub) -> None:
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

    add_drill_commands(sub)  # chaos, chaos-check, soak: entrypoints/cli_drills.py

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


def _add_model_commands(sub) -> None:
    p = sub.add_parser("eval", help="the paper's evaluation suite on model.path: avg@k per benchmark",
                       description=EVAL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="CONFIG|key=value",
                   help="YAML run configs (layered in order), then dotted overrides, e.g. evaluation.limit=20")
    p.add_argument("--out", help="directory for eval.json and eval.md (default evals/<model name>)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("export", help="export a run's (or checkpoint's) policy in Hugging Face format")
    p.add_argument("source", help="a run directory (its newest complete checkpoint), a checkpoint directory, or a "
                   "Hugging Face model directory")
    p.add_argument("--out", required=True, help="an empty or new directory")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("plan", help="GPU memory per GPU (policy, V, optimizer states, KV cache) of a config on a "
                       "cluster, and the disk its run writes; exits 1 naming the shortfall when it cannot fit")
    p.add_argument("config", help="YAML run config, e.g. configs/presets/qwen3-8b-base-math.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. value.num_ranks=4")
    p.add_argument("--nodes", type=int, help="nodes (default: cluster.nodes of the config)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: cluster.gpus_per_node)")
    p.add_argument("--gpu-memory", type=float, metavar="GB", help="memory of one GPU in GB (default: "
                   "cluster.gpu_memory_gb)")
    p.add_argument("--headroom", type=float, help="share of each learner / value GPU kept free for activations "
                   "(default: cluster.headroom)")
    p.add_argument("--disk", type=float, metavar="GB", help="disk the run directory may use, in GB (default: "
                   "cluster.disk_gb; unset: the disk the run writes is printed, not checked)")
    p.set_defaults(func=_cmd_plan)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pcl", description="Prompt Curriculum Learning: RL post-training with "
                                     "value-model prompt selection.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_training_commands(sub)
    _add_run_commands(sub)
    _add_model_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides (and further YAML files) may come after options (`pcl train cfg.yaml --run-dir d run.steps=3`):
    # argparse leaves those as unknown arguments, which are taken as overrides where the command has them.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if not hasattr(args, "overrides") or any(u.startswith("-") or not ("=" in u or u.endswith((".yaml", ".yml")))
                                                 for u in unknown):
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
