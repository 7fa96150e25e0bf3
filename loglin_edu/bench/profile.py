"""Where the time goes: the device time of every kernel launch of one forward+backward, against its work.

    python -m loglin_edu.bench.profile --lengths 1024 65536 --out book/results/kernels_profile_h200.json

For each length of the benchmark setting, ``torch.profiler`` records a few forward+backward steps of our
kernels; every GPU kernel's device time is summed per step and set beside the matrix-product work that
kernel does in the tree schedule (:func:`kernel_work`), so each launch can be read against its own floor
(``flops / 790 TFLOP/s``). Kernels outside the ladder (memsets, copies, the host-side cumulative sums)
are listed too: they are part of the step.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..provenance import DEFAULT_RESULTS, device_slug, provenance, write_json
from .implementations import IMPLEMENTATIONS
from .settings import GPU, MATMUL_FLOPS, Setting, prepare


def kernel_work(B: int, T: int, s: Setting) -> dict[str, int]:
    """Matrix-product flops of each kernel of the tree schedule for ``B`` sequences of ``T`` tokens (their sum
    is :func:`~loglin_edu.bench.settings.counted_work`'s forward plus backward)."""
    C, H, K, V = s.chunk_size, s.heads, s.key, s.value
    N = -(-T // C)
    reads = sum(bin(c).count("1") for c in range(N)) * C
    per_head = B * H
    leaves, intra, level_reads = 2 * T * K * V, 2 * T * C * (K + V), 2 * reads * K * V
    return {
        "fenwick_tree_kernel": per_head * leaves,
        "loglinear_fwd_kernel": per_head * (intra + level_reads),
        "node_grad_kernel": per_head * level_reads,
        "dq_kernel": per_head * (2 * T * C * (2 * K + V) + level_reads),
        "dkdv_kernel": per_head * (2 * T * C * (2 * K + 2 * V) + 2 * leaves),
    }


def profile_step(name: str, inputs: dict, steps: int = 5) -> list[dict]:
    """Device time per forward+backward step of every kernel ``IMPLEMENTATIONS[name]`` launches, largest first:
    ``[{kernel, calls, ms}]`` (calls and ms per step)."""
    from torch.profiler import ProfilerActivity, profile

    fn, names = IMPLEMENTATIONS[name]
    leaves = [inputs[n] for n in names]
    for leaf in leaves:
        leaf.requires_grad_(True)
    do = torch.randn_like(fn(inputs))

    def step():
        for leaf in leaves:
            leaf.grad = None
        fn(inputs).backward(do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    for leaf in leaves:
        leaf.requires_grad_(False)
        leaf.grad = None
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us > 0 and event.count:
            rows.append(dict(kernel=event.key, calls=event.count / steps, ms=device_us / 1e3 / steps))
    rows = [r for r in rows if not r["kernel"].startswith(("ProfilerStep", "cudaDevice"))]
    return sorted(rows, key=lambda r: -r["ms"])


def profile_lengths(s: Setting, lengths, name: str = "loglinear (ours, triton)", steps: int = 5) -> list[dict]:
    """:func:`profile_step` at every length, each kernel with its counted flops and fraction of its floor."""
    out = []
    for T in lengths:
        B = s.tokens // T
        inputs = prepare(B, T, s, "cuda")
        kernels = profile_step(name, inputs, steps)
        work = kernel_work(B, T, s)
        for row in kernels:
            flops = next((f for k, f in work.items() if k in row["kernel"]), None)
            if flops is not None:
                row["flops"] = flops
                row["floor_ms"] = 1e3 * flops / MATMUL_FLOPS
                row["fraction_of_floor"] = row["floor_ms"] / row["ms"]
        total = sum(r["ms"] for r in kernels)
        out.append(dict(T=T, B=B, implementation=name, total_ms=total, kernels=kernels))
        print(f"T={T:6d} {name}: {total:.2f} ms of kernels per step", flush=True)
        for r in kernels[:12]:
            floor = f"  {100 * r['fraction_of_floor']:5.1f}% of its floor" if "fraction_of_floor" in r else ""
            print(f"    {r['ms']:8.3f} ms  x{r['calls']:<4g} {r['kernel'][:60]}{floor}", flush=True)
        del inputs
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.bench.profile",
                                     description="Device time of every kernel of one forward+backward.")
    parser.add_argument("--lengths", type=int, nargs="*", default=[1024, 65536])
    parser.add_argument("--only", nargs="*", default=["loglinear (ours, triton)"],
                        help="implementations to profile (names of loglin_edu.bench.implementations)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, help=f"results JSON (default {DEFAULT_RESULTS}/kernels_profile_<device>.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("profiling needs a CUDA GPU")
    s = replace(GPU, lengths=tuple(args.lengths))
    result = provenance("python -m loglin_edu.bench.profile " + " ".join(sys.argv[1:] if argv is None else argv), "cuda")
    result["setting"] = asdict(s)
    result["profiles"] = []
    out = args.out or DEFAULT_RESULTS / f"kernels_profile_{device_slug()}.json"
    for name in args.only:
        result["profiles"] += profile_lengths(s, s.lengths, name, args.steps)
        write_json(out, result)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
