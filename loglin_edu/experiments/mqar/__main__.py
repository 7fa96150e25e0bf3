"""The command line of the recall experiments: ``python -m loglin_edu.experiments.mqar --help``.

    python -m loglin_edu.experiments.mqar --tier cpu                                       # the CPU tier
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --budget-s 540 --out runs/recall   # one piece
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --merge --out runs/recall --results book/results

    # jobs merged before (another machine, another day) join those of the run folder
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --merge --out runs/recall \
        --include book/results/recall_reproduction.json --results book/results

    # a fixed total longer than one call: the same command again continues every job toward it
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --steps 15000 --budget-s 540 --out runs/recall

    # a cell's seeds as jobs of their own, each short enough for one call; the merge joins them
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --widths 32 --models gated_deltanet --seeds 0 \
        --steps 20000 --budget-s 540 --out runs/recall

    # two GPUs of one host: one piece each (disjoint --models), one --out, the same fixed --steps for all
    CUDA_VISIBLE_DEVICES=0 python -m loglin_edu.experiments.mqar --tier gpu --models transformer,mamba2 ... &
    CUDA_VISIBLE_DEVICES=1 python -m loglin_edu.experiments.mqar --tier gpu --models loglinear_mamba2 ... &
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from ...provenance import write_json
from .jobs import merge, run_piece, run_tier, slug, tier_from_dict, worker
from .report import summary_table
from .settings import MODELS, TIERS, Tier, base_model
from .step_time import MODES

TASKS = {"mqar": ["gpu/mqar"], "lagged": ["gpu/lagged"], "all": ["gpu/mqar", "gpu/lagged"]}
MERGED = "recall_reproduction.json"


def choose_tier(args: argparse.Namespace, name: str) -> Tier:
    """The tier ``name`` with the command line's overrides applied."""
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
    if args.chunk_size:
        changes["chunk_size"] = args.chunk_size
    if args.attention_hybrid is not None:
        changes["attention_hybrid"] = args.attention_hybrid
    train_changes = {k: v for k, v in dict(steps=args.steps, batch_size=args.batch_size, eval_every=args.eval_every,
                                           amp=args.amp or None, tf32=args.tf32 or None).items() if v is not None}
    if args.mode:
        train_changes.update(compile=args.mode.startswith("compiled"), graphs=args.mode.endswith("graphs"))
    if train_changes:
        changes["train"] = replace(tier.train, **train_changes)
    return replace(tier, **changes)


def mode_from(path: Path, budget_s: float | None, jobs: int) -> str:
    """The training-step mode of a step-time benchmark file under which every job trains the most steps.

    Jobs of a piece share the device and wait for each other before their steps are planned, so one mode serves
    all: the one maximising ``(budget_s - compile seconds) / Σ_models ms per step``, where a mode's compile
    seconds are its slowest model's time to the first step, scaled by ``jobs / models measured`` (the piece
    compiles that many jobs side by side on the same CPUs). Without a budget: the fastest step. Modes that
    failed for some model are skipped.
    """
    result = json.loads(path.read_text())
    models = sorted({r["model"] for r in result["rows"]})
    best, best_steps = None, -math.inf
    for mode in result["modes"]:
        rows = [r for r in result["rows"] if r["mode"] == mode and "ms_per_step" in r and not r["capture_error"]
                and not r.get("compile_error")]
        if len(rows) < len(models):
            continue
        per_step = sum(r["ms_per_step"] for r in rows) / 1e3
        warm_up = max(r["seconds_to_first_step"] for r in rows) * max(1.0, jobs / len(models))
        steps = (budget_s - warm_up) / per_step if budget_s else 1 / per_step
        if steps > best_steps:
            best, best_steps = mode, steps
    if best is None:
        raise ValueError(f"{path}: no mode ran for every model")
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.experiments.mqar",
                                     description="Associative-recall experiments: five architectures, one code path.")
    parser.add_argument("--tier", choices=["cpu", "gpu"], required=True)
    parser.add_argument("--task", choices=list(TASKS), default="mqar", help="gpu tier: which recall task(s)")
    parser.add_argument("--out", type=Path, default=None, help="run folder: data, one folder per job, results")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--budget-s", type=float, help="gpu tier: the piece's wall-clock seconds; new jobs get the "
                                                       "total steps that fit (same for all)")
    parser.add_argument("--jobs", type=int, help="gpu tier without a budget: at most this many jobs at once")
    parser.add_argument("--merge", action="store_true", help="gpu tier: merge the run folder's job results into "
                                                             f"one file, {MERGED}, in --results (or --out)")
    parser.add_argument("--include", type=Path, action="append", default=[],
                        help="--merge: a merged results file whose jobs count where the run folder has none "
                             "(repeatable)")
    parser.add_argument("--keep", type=Path, help="--merge: a merged file whose other tiers the new file keeps "
                                                  f"(default: an existing {MERGED} at the destination)")
    parser.add_argument("--mode", choices=MODES, help="training-step mode of every job (default: the tier's)")
    parser.add_argument("--mode-from", type=Path, help="a step-time benchmark JSON: every job gets the mode that "
                                                       "trains most within --budget-s (compilation counted)")
    parser.add_argument("--models", help="comma-separated subset of " + ",".join(MODELS) + " (and *_tied variants)")
    parser.add_argument("--widths", help="comma-separated model widths")
    parser.add_argument("--seeds", help="comma-separated seeds (gpu tier: jobs of these seeds only, in folders named "
                                        "by them, model-dWIDTH-sSEEDS; a merge, without --seeds, joins a cell's jobs)")
    parser.add_argument("--lrs", help="comma-separated peak learning rates")
    parser.add_argument("--steps", type=int, help="total steps of every job (fixed: no planning, kept in each job's "
                                                  "plan.json; with --budget-s a piece stops at its deadline and the "
                                                  "next piece continues toward the same total)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--eval-every", type=int)
    parser.add_argument("--amp", action="store_true", help="bf16 autocast on CUDA (operators stay float32)")
    parser.add_argument("--tf32", action="store_true", help="the training step's float32 matrix products in TF32 on CUDA")
    parser.add_argument("--backend", choices=["torch", "auto", "triton"],
                        help="'auto': the Triton kernel for log-linear Mamba-2 on CUDA; 'triton': the Triton kernels "
                             "of every recurrent mixer (default: torch)")
    parser.add_argument("--chunk-size", type=int, help="the recurrent mixers' chunk (default: the tier's, 64)")
    parser.add_argument("--attention-hybrid", action=argparse.BooleanOptionalAction,
                        help="the Transformer as Zoology builds it: a gated convolution layer, then an attention "
                             "layer (default: the tier's; the MQAR tier's is on)")
    parser.add_argument("--commit", help="commit hash to record (default: git rev-parse HEAD)")
    parser.add_argument("--results", type=Path, help="also write the results file(s) into this directory")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "WIDTH"), help=argparse.SUPPRESS)
    parser.add_argument("--tier-json", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--plan", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # comparisons stay in true float32
    if args.worker:
        worker(tier_from_dict(json.loads(args.tier_json)), args.worker[0], int(args.worker[1]), args.out, device,
               deadline=args.deadline, plan=args.plan, stop_at=args.stop_at)
        return
    command = "python -m loglin_edu.experiments.mqar " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.tier == "cpu":
        if device == "cpu":
            torch.set_num_threads(1)  # small tensors gain nothing from a second thread, and lose a lot on a busy CPU
        tier = choose_tier(args, "cpu")
        result = run_tier("cpu", tier, out=args.out, device=device, progress=not args.no_progress, commit=args.commit,
                          command=command)
        if args.results:
            write_json(args.results / "mqar_cpu.json", result)
        print("\n".join(summary_table(result)))
        return
    if args.out is None:
        parser.error("the gpu tier needs --out (its run folder)")
    tiers = {name: choose_tier(args, name) for name in TASKS[args.task]}
    if args.merge and args.seeds:
        parser.error("--merge joins the jobs of every seed of a cell: leave --seeds out")
    if args.merge:
        merged = merge(tiers, args.out, device=device, commit=args.commit, command=command, include=args.include)
        destination = (args.results or args.out) / MERGED
        kept = args.keep or (destination if destination.exists() else None)
        if kept is not None:  # tiers merged before (another task, another machine) stay
            merged["tiers"] = {**json.loads(kept.read_text())["tiers"], **merged["tiers"]}
        write_json(destination, merged)
        for name, result in merged["tiers"].items():
            print(name)
            print("\n".join(summary_table(result)))
        return
    modes = None
    if args.mode_from:
        count = sum(len(t.models) * len(t.widths) for t in tiers.values())
        mode = mode_from(args.mode_from, args.budget_s, count)
        modes = {base_model(m): mode for t in tiers.values() for m in t.models}
        print(f"step mode of every job: {mode} (from {args.mode_from})", flush=True)
    done = run_piece(tiers, args.out, device, budget_s=args.budget_s, modes=modes, jobs=args.jobs,
                     fixed=args.steps is not None, by_seeds=args.seeds is not None)
    print(f"{len(done)} jobs of {', '.join(slug(n) for n in tiers)} in {args.out}; merge with --merge", flush=True)


if __name__ == "__main__":
    main()
