"""The command line of the recall experiments: ``python -m loglin_edu.experiments.mqar --help``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from ...provenance import write_json
from .jobs import run_job, run_parallel, run_tier, slug, tier_from_dict
from .report import summary_table
from .settings import MODELS, TIERS, Tier


def choose_tier(args: argparse.Namespace, task: str) -> tuple[str, Tier]:
    """The tier the command line names, with its overrides applied."""
    name = "cpu" if args.tier == "cpu" else f"gpu/{task}"
    tier = TIERS[name]
    changes = {}
    if args.models:
        changes["models"] = tuple(args.models.split(","))
    if args.widths:
        changes["widths"] = tuple(int(w) for w in args.widths.split(","))
    if args.seeds:
        changes["seeds"] = tuple(int(s) for s in args.seeds.split(","))
    if args.lrs:
        changes["lrs"] = tuple(float(x) for x in args.lrs.split(","))
    if args.backend:
        changes["backend"] = args.backend
    train_changes = {k: v for k, v in dict(steps=args.steps, batch_size=args.batch_size, eval_every=args.eval_every,
                                           amp=args.amp or None).items() if v is not None}
    if train_changes:
        changes["train"] = replace(tier.train, **train_changes)
    return name, replace(tier, **changes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.experiments.mqar",
                                     description="Associative-recall experiments: five architectures, one code path.")
    parser.add_argument("--tier", choices=["cpu", "gpu"], required=True)
    parser.add_argument("--task", choices=["mqar", "lagged", "both"], default="mqar", help="gpu tier: which recall task")
    parser.add_argument("--out", type=Path, default=None, help="directory for logs, checkpoints and results.json")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--jobs", type=int, default=1, help="parallel worker processes (gpu tier)")
    parser.add_argument("--budget-s", type=float, help="gpu tier: fit the number of steps into this many seconds")
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--models", help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--widths", help="comma-separated model widths")
    parser.add_argument("--seeds", help="comma-separated seeds")
    parser.add_argument("--lrs", help="comma-separated peak learning rates")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--eval-every", type=int)
    parser.add_argument("--amp", action="store_true", help="bf16 autocast on CUDA (operators stay float32)")
    parser.add_argument("--backend", choices=["torch", "auto"],
                        help="'auto': the Triton kernel for log-linear Mamba-2 on CUDA (default: torch)")
    parser.add_argument("--commit", help="commit hash to record (default: git rev-parse HEAD)")
    parser.add_argument("--results", type=Path, help="also write each results file into this directory (e.g. book/results)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "WIDTH"), help=argparse.SUPPRESS)
    parser.add_argument("--tier-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # comparisons stay in true float32
    if args.worker:
        tier = tier_from_dict(json.loads(args.tier_json))
        record = run_job(tier, args.worker[0], int(args.worker[1]), out_dir=args.out, device=device, progress=False,
                         data_cache=args.out.parent / "data.pt", stop_at=args.stop_at, deadline=args.deadline)
        (args.out / "record.json").write_text(json.dumps(record))
        return
    command = "python -m loglin_edu.experiments.mqar " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.tier == "cpu":
        name, tier = choose_tier(args, "mqar")
        results = {name: run_tier(name, tier, out=args.out, device=device, progress=not args.no_progress,
                                  commit=args.commit, command=command)}
    else:
        if args.out is None:
            parser.error("the gpu tier needs --out")
        tasks = ["mqar", "lagged"] if args.task == "both" else [args.task]
        tiers = dict(choose_tier(args, task) for task in tasks)
        results = run_parallel(tiers, args.out, device, jobs=args.jobs, budget_s=args.budget_s, commit=args.commit,
                               command=command)
    for name, result in results.items():
        if args.results:
            args.results.mkdir(parents=True, exist_ok=True)
            write_json(args.results / f"mqar_{slug(name)}.json", result)
        print(name)
        for row in summary_table(result):
            print(row)


if __name__ == "__main__":
    main()
