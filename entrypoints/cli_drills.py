"""The `pcl` commands that drill a run for what minutes of training cannot show (docs/operations.md): `pcl chaos`
(a run under a seeded schedule of faults, then its invariants), `pcl chaos-check` (those invariants of a finished
run) and `pcl soak` (a long run sampled from outside). Registered by `entrypoints.cli`; each imports its work late.
"""

from __future__ import annotations

import argparse

from entrypoints.cli_args import config_files


def _cmd_chaos(args: argparse.Namespace) -> int:
    from entrypoints.chaos import run_chaos

    return run_chaos(args.config, args.overrides, seed=args.seed, faults=args.faults, window_s=args.window,
                     out=args.out, reference=args.reference, timeout_s=args.timeout, step_s=args.step_seconds)


def _cmd_chaos_check(args: argparse.Namespace) -> int:
    from entrypoints.chaos.check import check_run
    from pcl.config import load_config

    return check_run(load_config(*config_files(args)), args.run_dir)


def _cmd_chaos_cluster(args: argparse.Namespace) -> int:
    from pathlib import Path

    from entrypoints.chaos_cluster import run_chaos_cluster

    kinds = tuple(k for k in args.kinds.split(",") if k) if args.kinds else None
    out = Path(args.out or f"runs/chaos-cluster-seed{args.seed}")
    return run_chaos_cluster(args.seed, out, per_kind=args.per_kind, keep=args.keep,
                             **({"kinds": kinds} if kinds else {}))


def _cmd_soak(args: argparse.Namespace) -> int:
    from entrypoints.soak import report_again, run_soak

    if args.report_only:
        return report_again(args.config, args.overrides, args.out, args.warmup)
    return run_soak(args.config, args.overrides, minutes=args.minutes, out=args.out, sample_s=args.sample_seconds,
                    warmup_s=args.warmup)


def add_drill_commands(sub) -> None:
    p = sub.add_parser("chaos", help="train under a seeded schedule of faults with control-plane traffic, then "
                       "check that nothing was lost (docs/operations.md)")
    p.add_argument("config", help="YAML run config, e.g. configs/chaos.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. run.steps=12")
    p.add_argument("--seed", type=int, default=0, help="the schedule's seed, also the run's run.seed (default 0)")
    p.add_argument("--faults", type=int, default=12, help="faults in the schedule (default 12: every kind)")
    p.add_argument("--window", type=float, help="seconds of training the faults are drawn over (default: 0.7 of "
                   "the run's expected length, run.steps x --step-seconds)")
    p.add_argument("--step-seconds", type=float, help="seconds a step takes unfaulted, for the default window "
                   "(default: measured by a reference run in OUT/reference, else 2.0, configs/chaos.yaml's pace)")
    p.add_argument("--out", help="output directory (default runs/chaos-<run.name>-seed<S>)")
    p.add_argument("--reference", action="store_true", help="also train the unfaulted reference and compare "
                   "the final weights (rollout.deterministic) or held-out accuracy")
    p.add_argument("--timeout", type=float, help="give up after this many seconds (default 2 x window + 1200)")
    p.set_defaults(func=_cmd_chaos)

    p = sub.add_parser("chaos-check", help="the invariants of a finished run from its records and its Redis "
                       "(redis.url / REDIS_URL, or the embedded one's data directory): steps, batches, versions, "
                       "trackers, streams (docs/operations.md, \"Chaos runs\")")
    p.add_argument("config", help="the run's YAML config, as it was trained with")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="the run's overrides, e.g. run.steps=12")
    p.add_argument("--run-dir", required=True, help="the run's directory")
    p.set_defaults(func=_cmd_chaos_check)

    p = sub.add_parser("chaos-cluster", help="the tiny run as a Ray job on a compose cluster of containers under a "
                       "seeded schedule of node faults and partitions, then its invariants and report (needs Docker "
                       "and root; docs/operations.md, \"Chaos across machines\")")
    p.add_argument("--seed", type=int, default=0, help="the schedule's seed (default 0)")
    p.add_argument("--per-kind", type=int, default=2, help="faults of each kind (default 2)")
    p.add_argument("--kinds", help="comma-separated fault kinds (default: all, pcl/tools/cluster_schedule.py)")
    p.add_argument("--out", help="output directory (default runs/chaos-cluster-seed<S>)")
    p.add_argument("--keep", action="store_true", help="leave the cluster up at the end (to look at it)")
    p.set_defaults(func=_cmd_chaos_cluster)

    p = sub.add_parser("soak", help="train for a set time under steady control-plane traffic, sampling every "
                       "process, Redis, the run's files and Ray's session: what grows? (docs/operations.md)")
    p.add_argument("config", help="YAML run config, e.g. configs/soak.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. rollout.engine=vllm")
    p.add_argument("--minutes", type=float, default=60.0, help="minutes of training (default 60)")
    p.add_argument("--sample-seconds", type=float, default=15.0, help="seconds between samples (default 15)")
    p.add_argument("--warmup", type=float, metavar="SECONDS", help="seconds of training left out of the slopes "
                   "(default: the larger of 300 s and a third of the run, and past the first checkpoint)")
    p.add_argument("--out", help="output directory (default runs/soak-<run.name>-<time>)")
    p.add_argument("--report-only", action="store_true", help="build the report again from the samples in --out")
    p.set_defaults(func=_cmd_soak)
