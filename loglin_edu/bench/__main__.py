"""The command line of :mod:`loglin_edu.bench` (see there): ``python -m loglin_edu.bench --help``."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from ..provenance import DEFAULT_RESULTS, device_slug, provenance, write_json
from .accuracy import ACCURACY_SHAPES, DELTA_ACCURACY_SHAPES, accuracy, delta_accuracy
from .implementations import BY_MODEL, CPU_ONLY, GPU_ONLY
from .measure import benchmark, config_from_spec, precision_ladder, variants
from .report import plot, summary_table, with_floor
from .settings import MODELS, SETTINGS, Setting

RESULT_PREFIX = {"loglinear_mamba2": "kernels", "gated_deltanet": "kernels_gdn"}

VARIANTS = ((1, 4, 4, 4), (8, 4, 4, 4), (8, 4, 8, 4), (48, 4, 8, 4), (8, 3, 4, 8))
"""``--variants`` without ``--configs``: (head_group, block_levels, num_warps, tree_warps) of each run."""
DELTA_VARIANTS = ((64, 32, 8, 8, 1), (32, 32, 4, 8, 1), (64, 32, 8, 8, 2), (32, 32, 8, 4, 2), (64, 64, 8, 8, 1))
"""``--model gated_deltanet --variants``: (value_tile, grad_value_tile, walk_warps, grad_warps, num_stages) of each run."""
LINEAR_VARIANTS = ((16, 64, 8, 2), (16, 64, 8, 1), (16, 32, 8, 2), (16, 32, 4, 2), (8, 64, 8, 2), (32, 64, 8, 2),
                   (1, 64, 8, 2))
"""``--variants --linear``: (block_chunks, key_split, num_warps, num_stages) of the chunk-parallel linear Mamba-2
(step 1b), each run; block_chunks = 1 is the fully chunk-parallel extreme."""


def parse_shape(text: str) -> tuple[int, ...]:
    """``"B,T,H,Hk,K,V"`` as six positive integers."""
    parts = text.split(",")
    if len(parts) != 6 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"a shape is B,T,H,Hk,K,V (six positive integers), got {text!r}")
    return tuple(int(p) for p in parts)


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--decode" in argv:  # the decoding benchmark has its own options (python -m loglin_edu.bench --decode --help)
        from .decode import main as decode_main

        return decode_main([a for a in argv if a != "--decode"])
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.bench", description="How fast is it: the log-linear kernels against SDPA flash, linear Mamba-2 and fla-core.")
    parser.add_argument("--model", choices=MODELS, default="loglinear_mamba2",
                        help="log-linear Mamba-2 (48 heads, K=128, V=64) or log-linear Gated DeltaNet (the authors' "
                        "setting: 6 heads, K=192, V=384), against their baselines")
    parser.add_argument("--tier", choices=("gpu", "cpu"), default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", type=int, nargs="*", help="sequence lengths (default: the tier's)")
    parser.add_argument("--heads", type=int, help="number of heads (default: the setting's)")
    parser.add_argument("--key", type=int, help="key width K (default: the setting's)")
    parser.add_argument("--value", type=int, help="value width V (default: the setting's)")
    parser.add_argument("--only", nargs="*", help="implementations to run (substrings of their names)")
    parser.add_argument("--out", type=Path, help=f"results JSON (default {DEFAULT_RESULTS}/kernels_<device>.json, "
                        "kernels_gdn_<device>.json for gated_deltanet, relative to the directory the command runs in)")
    parser.add_argument("--accuracy", action="store_true", help="measure errors against float64 instead of speed")
    parser.add_argument("--shapes", nargs="*", metavar="B,T,H,Hk,K,V",
                        help="--accuracy: the shapes to measure (default: the model's accuracy shapes)")
    parser.add_argument("--dtypes", nargs="*", choices=("float32", "float16", "bfloat16"),
                        help="--accuracy: the input types to measure (default: all three on a GPU, float32 on a CPU)")
    parser.add_argument("--variants", action="store_true", help="time our kernel under several launch configurations")
    parser.add_argument("--linear", action="store_true",
                        help="--variants: the chunk-parallel linear Mamba-2 (kernel step 1b) instead of our log-linear "
                        "kernel, under LinearLaunchConfig variants")
    parser.add_argument("--configs", nargs="*", metavar="G,M,W,TW",
                        help="--variants, --accuracy: launch configurations as head_group,block_levels,num_warps,tree_warps "
                        "or as LaunchConfig fields, e.g. tree_registers=true,tree_key_split=2 "
                        "(gated_deltanet: value_tile,grad_value_tile,walk_warps,grad_warps,num_stages; --linear: "
                        "block_chunks,key_split,num_warps,num_stages)")
    parser.add_argument("--precision", action="store_true",
                        help="time and measure the errors of every rung of LaunchConfig.precision at each length")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--decode", action="store_true",
                        help="the decoding benchmark instead (its own options: --decode --help)")
    args = parser.parse_args(argv)
    if args.linear and not args.variants:
        parser.error("--linear goes with --variants")
    if args.configs and not (args.variants or args.accuracy):
        parser.error("--configs goes with --variants or --accuracy")
    if (args.shapes or args.dtypes) and not args.accuracy:
        parser.error("--shapes and --dtypes go with --accuracy")

    s = SETTINGS[args.model, args.tier]
    overrides = {name: value for name, value in (("lengths", tuple(args.lengths or ())), ("heads", args.heads),
                                                 ("key", args.key), ("value", args.value)) if value}
    s = Setting(**{**asdict(s), **overrides})
    delta = args.model == "gated_deltanet"
    device = torch.device("cuda" if args.tier == "gpu" else "cpu")
    if device.type == "cpu" and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # this program's own process: the interpreter on a CPU
    from ..kernels.config import DeltaLaunchConfig, LaunchConfig, LinearLaunchConfig

    result = provenance("python -m loglin_edu.bench " + " ".join(argv), device)
    result["setting"] = asdict(s)
    mode = ("accuracy" if args.accuracy else "precision_ladder" if args.precision
            else ("linear_variants" if args.linear else "variants") if args.variants else None)
    prefix = RESULT_PREFIX[args.model]
    out = args.out or DEFAULT_RESULTS / f"{prefix}_{mode + '_' if mode else ''}{device_slug(device)}.json"
    if args.accuracy:
        measure_errors = delta_accuracy if delta else accuracy
        try:
            shapes = [parse_shape(text) for text in args.shapes] if args.shapes else (
                (DELTA_ACCURACY_SHAPES if delta else ACCURACY_SHAPES) if device.type == "cuda"
                else ((1, 40, 2, 1, 16, 16),))
            configs = [None] if not args.configs else [
                config_from_spec(spec, DeltaLaunchConfig if delta else LaunchConfig) for spec in args.configs]
        except ValueError as error:
            parser.error(str(error))
        dtypes = ([getattr(torch, name) for name in args.dtypes] if args.dtypes else
                  (torch.float32, torch.float16, torch.bfloat16) if device.type == "cuda" else (torch.float32,))
        cases = [(shape, dt, config) for shape in shapes for config in configs for dt in dtypes]
        result["accuracy"] = []
        for shape, dt, config in cases:  # written after every case: a run stopped midway keeps those it measured
            r = measure_errors(shape, dt, device, config=config)
            if args.configs:
                r["config"] = asdict(config)
            result["accuracy"].append(r)
            result["complete"] = len(result["accuracy"]) == len(cases)
            write_json(out, result)
            print(r["dtype"], r["shape"], {k: f"{v:.1e}" for k, v in r["errors"].items()}, flush=True)
    elif args.precision:
        result["precision"] = precision_ladder(s, s.lengths, device)
    elif args.variants:
        if args.linear and delta:
            parser.error("--linear times linear Mamba-2: it goes with --model loglinear_mamba2")
        kind, defaults = ((LinearLaunchConfig, LINEAR_VARIANTS) if args.linear else (DeltaLaunchConfig, DELTA_VARIANTS)
                          if delta else (LaunchConfig, VARIANTS))
        specs = args.configs or [",".join(map(str, values)) for values in defaults]
        try:
            configs = [config_from_spec(spec, kind) for spec in specs]
        except ValueError as error:
            parser.error(f"--configs: {error}")
        def save_variants(rows):
            result["variants"] = rows
            result["complete"] = len(rows) == len(configs) * len(s.lengths)
            write_json(out, result)

        result["variants"] = variants(s, s.lengths, configs, device, linear=args.linear, on_row=save_variants)
        result["complete"] = True
    else:
        names = [n for n in BY_MODEL[args.model] if n not in (GPU_ONLY if device.type == "cpu" else CPU_ONLY)]
        if args.only:
            names = [n for n in names if any(o in n for o in args.only)]

        def save(rows):
            result["rows"] = [with_floor(row, s) for row in rows]
            result["complete"] = len(rows) == len(names) * len(s.lengths)
            write_json(out, result)
            row = rows[-1]
            timings = (("fwd", "forward_ms"), ("fwd+bwd", "forward_backward_ms"))
            measured = [f"{what} {row[key]:.2f} ms" for what, key in timings if row.get(key) is not None]
            peak = row.get("peak_memory_mib")
            if peak is not None and peak == peak:  # a CPU has no allocator statistics: NaN
                measured.append(f"peak {peak:.0f} MiB")
            note = row.get("error", row.get("skipped", ""))
            print(f"T={row['T']:6d} {row['name']}: {', '.join(measured)} {note}".rstrip(), flush=True)

        benchmark(s, names, device, progress=not args.quiet, on_row=save)
    write_json(out, result)
    if "rows" in result:
        plot(result, out.with_suffix(".png"))
        print(summary_table(result["rows"], s))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
