"""Where the time goes: the device time of every kernel launch of a forward and of a backward, against its work.

    python -m loglin_edu.bench.profile --lengths 1024 65536 --out book/results/kernels_profile_h200.json
    python -m loglin_edu.bench.profile --model gated_deltanet   # log-linear Gated DeltaNet, its benchmark setting

For each length of the model's benchmark setting, ``torch.profiler`` records a few forwards, then the
backwards of a few more (each forward run outside the record); every GPU kernel's device time is summed per
step and phase and set beside the matrix-product work that kernel does (:func:`kernel_work`), so each launch
can be read against its own floor (``flops / 790 TFLOP/s``). Kernels outside the ladder (memsets, copies, the
host-side cumulative sums) are listed too: they are part of the step. Every compiled Triton kernel is listed
with its registers per thread and the registers it spills (:func:`compiled_kernels`).
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..provenance import DEFAULT_RESULTS, device_slug, provenance, write_json
from .implementations import IMPLEMENTATIONS
from .settings import MATMUL_FLOPS, MODELS, SETTINGS, Setting, carried_levels, prepare

OURS = {"loglinear_mamba2": "loglinear (ours, triton)", "gated_deltanet": "loglinear gated deltanet (ours, triton)"}
PROFILED = {"loglinear_mamba2": (OURS["loglinear_mamba2"], "mamba2 linear (ours, triton step 1)",
                                 "mamba2 linear (ours, triton chunk-parallel)"),
            "gated_deltanet": (OURS["gated_deltanet"],)}
"""What ``python -m loglin_edu.bench.profile`` profiles without ``--only``: our kernels of each model (for log-linear
Mamba-2 also the two linear Mamba-2 rungs, chapter 9's comparison)."""
PHASES = ("forward", "backward")
COMPILED_FIELDS = ("name", "n_regs", "n_spills", "num_warps", "num_stages", "shared")


def kernel_work(B: int, T: int, s: Setting) -> dict[str, int]:
    """Matrix-product flops of each kernel of the model's schedule for ``B`` sequences of ``T`` tokens (their sum
    is :func:`~loglin_edu.bench.settings.counted_work`'s forward plus backward)."""
    if s.model == "gated_deltanet":
        return delta_kernel_work(B, T, s)
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


def delta_kernel_work(B: int, T: int, s: Setting) -> dict[str, int]:
    """:func:`kernel_work` of log-linear Gated DeltaNet (kernels steps 6-8), in the terms of
    :func:`~loglin_edu.bench.settings.counted_work_delta`: a chunk transition or read is ``2·C·K·V`` flops
    (``ckv``); the WY factors' kernel forms everything per chunk but the intra product ``(P ⊙ Λ) V``, which the
    output kernel forms; the stacked reverse walk one transition (``2·ckv``) per chunk and carried level
    (:func:`~loglin_edu.bench.settings.carried_levels`) and ``ckv`` per read; the level gradients are one
    ``2·K·K·V`` product per carried level for ``G``, four ``[C, K]``
    products by ``G`` or ``D_left`` per chunk, and ``ckv`` per read for the reads; the WY backward (three times the factors and the intra product) is
    split as its kernels run: four ``2·C·V`` products per token over the values, four ``2·C·K`` for dq and dk, the
    rest (the pass over the keys and the solve) in between."""
    C, H, K, V = s.chunk_size, s.heads, s.key, s.value
    N = -(-T // C)
    n = (N - 1).bit_length()
    reads = sum(bin(c).count("1") for c in range(N))
    carried = carried_levels(N)
    ckv = 2 * C * K * V
    intra = T * 2 * C * V
    factors = T * (4 * 2 * C * K + 2 * C * V + (C // 16 + 18) * 2 * C * C)
    per_head = B * H
    return {
        "delta_chunk_kernel": per_head * factors,
        "level_walk_kernel": per_head * n * N * 2 * ckv,
        "delta_output_kernel": per_head * (intra + reads * ckv),
        "level_adjoint_walk_kernel": per_head * (carried * 2 * ckv + reads * ckv),
        "slot_gram_kernel": per_head * carried * 2 * K * K * V,
        "level_gram_grads_kernel": per_head * N * (2 * 2 * C * K * K + 2 * ckv),
        "level_read_grad_kernel": per_head * reads * ckv,
        "delta_chunk_values_bwd_kernel": per_head * 4 * intra,
        "delta_chunk_solve_bwd_kernel": per_head * (3 * (factors + intra) - 4 * intra - T * 4 * 2 * C * K),
        "delta_chunk_qk_bwd_kernel": per_head * T * 4 * 2 * C * K,
    }


def device_times(run) -> dict[str, list]:
    """``{kernel: [launches, device ms]}`` of every GPU kernel ``run()`` launches, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()  # nothing launched before is recorded
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us > 0 and event.count and not event.key.startswith(("ProfilerStep", "cudaDevice")):
            times[event.key] = [event.count, device_us / 1e3]
    return times


def profile_step(name: str, inputs: dict, steps: int = 5, times=device_times, config=None) -> list[dict]:
    """Device time per step of every kernel ``IMPLEMENTATIONS[name]`` launches in its forward and in its backward,
    largest first within each phase: ``[{kernel, phase, calls, ms}]`` (calls and ms per step). ``times`` is
    :func:`device_times` or a function like it; ``config``: a launch configuration of our kernel (``name`` one of
    :data:`OURS`)."""
    fn, names = IMPLEMENTATIONS[name]
    if config is not None:
        fn = functools.partial(fn, config=config)
    leaves = [inputs[n] for n in names]
    for leaf in leaves:
        leaf.requires_grad_(True)
    do = torch.randn_like(fn(inputs))

    def forwards():
        for _ in range(steps):
            fn(inputs)

    def step():
        for leaf in leaves:
            leaf.grad = None
        fn(inputs).backward(do)

    for _ in range(3):
        step()
    totals = {phase: {} for phase in PHASES}

    def add(phase, measured):
        for kernel, (calls, ms) in measured.items():
            entry = totals[phase].setdefault(kernel, [0, 0.0])
            entry[0] += calls
            entry[1] += ms

    add("forward", times(forwards))
    for _ in range(steps):
        for leaf in leaves:
            leaf.grad = None
        out = fn(inputs)
        add("backward", times(functools.partial(out.backward, do)))
        del out
    for leaf in leaves:
        leaf.requires_grad_(False)
        leaf.grad = None
    rows = [dict(kernel=kernel, phase=phase, calls=calls / steps, ms=ms / steps)
            for phase in PHASES for kernel, (calls, ms) in totals[phase].items()]
    return sorted(rows, key=lambda r: (PHASES.index(r["phase"]), -r["ms"]))


def compiled_kernels(modules=None) -> list[dict]:
    """Every Triton kernel compiled so far in ``modules`` (default: the loaded modules of ``loglin_edu.kernels``),
    one row per compiled variant: ``{kernel, n_regs, n_spills, num_warps, num_stages, shared}`` — registers per
    thread and registers spilled to local memory, as the driver reports them when it loads the binary (a
    ``CompiledKernel``'s attributes; its ``metadata`` where a triton version keeps them there). Under the
    interpreter nothing is compiled: no rows."""
    if modules is None:
        modules = [m for name, m in list(sys.modules.items()) if name.startswith("loglin_edu.kernels") and m]
    rows, seen = [], set()
    for module in modules:
        for fn in vars(module).values():
            for cache in getattr(fn, "device_caches", {}).values():
                for kernel in cache[0].values():  # (kernels by key, ...) in every triton 3 layout
                    if id(kernel) in seen:
                        continue
                    seen.add(id(kernel))
                    rows.append({key: compiled_field(kernel, key) for key in COMPILED_FIELDS})
                    rows[-1]["kernel"] = rows[-1].pop("name")
    return sorted(rows, key=lambda r: (str(r["kernel"]), -(r["n_spills"] or 0)))


def compiled_field(kernel, name: str):
    """Attribute ``name`` of a compiled kernel, or of its ``metadata`` where the kernel has none."""
    value = getattr(kernel, name, None)
    return getattr(kernel.metadata, name, None) if value is None else value


def with_registers(row: dict, compiled: list[dict]) -> dict:
    """``row`` with ``n_regs``, ``n_spills`` of its kernel: the largest over the kernel's compiled variants."""
    variants = [c for c in compiled if c["kernel"] == row["kernel"]]
    for key in ("n_regs", "n_spills"):
        values = [c[key] for c in variants if c[key] is not None]
        if values:
            row[key] = max(values)
    return row


SAME_WORK = {"fenwick_block_kernel": "fenwick_tree_kernel"}
"""Kernels of a launch variant that do another kernel's counted work (:func:`kernel_work`)."""


def profile_lengths(s: Setting, lengths, name: str, steps: int = 5, device="cuda", times=device_times,
                    compiled=compiled_kernels, config=None) -> list[dict]:
    """:func:`profile_step` at every length, each kernel with its counted flops, fraction of its floor, and
    registers (``compiled``: :func:`compiled_kernels` or a function like it); ``config`` as there."""
    out = []
    for T in lengths:
        B = s.tokens // T
        inputs = prepare(B, T, s, device)
        kernels = profile_step(name, inputs, steps, times, config)
        work, table = kernel_work(B, T, s), compiled()
        for name_as, name_of in SAME_WORK.items():
            if name_of in work:
                work[name_as] = work[name_of]
        for row in kernels:
            with_registers(row, table)
            flops = work.get(row["kernel"])  # by its exact name: block_dq_kernel does not do dq_kernel's work
            if flops is not None:
                row["flops"] = flops
                row["floor_ms"] = 1e3 * flops / MATMUL_FLOPS
                row["fraction_of_floor"] = row["floor_ms"] / row["ms"] if row["ms"] > 0 else None
        phase_ms = {f"{phase}_ms": sum(r["ms"] for r in kernels if r["phase"] == phase) for phase in PHASES}
        total = sum(phase_ms.values())
        out.append(dict(T=T, B=B, implementation=name, total_ms=total, **phase_ms, kernels=kernels))
        print(f"T={T:6d} {name}: {total:.2f} ms of kernels per step (forward {phase_ms['forward_ms']:.2f}, "
              f"backward {phase_ms['backward_ms']:.2f})", flush=True)
        for r in kernels[:24]:
            floor = f"  {100 * r['fraction_of_floor']:5.1f}% of its floor" if r.get("fraction_of_floor") else ""
            regs = f"  regs {r['n_regs']} spills {r['n_spills']}" if "n_regs" in r else ""
            print(f"    {r['phase']:8s} {r['ms']:8.3f} ms  x{r['calls']:<4g} {r['kernel'][:50]}{floor}{regs}",
                  flush=True)
        del inputs
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def config_of(name: str, model: str, config):
    """The launch configuration to profile implementation ``name`` with: ``--config`` for our kernel of ``model``
    (the only one it configures), ``None`` (its own defaults) for every other."""
    return config if name == OURS[model] else None


def model_launch_config(model: str, spec: str | None):
    """The launch configuration ``spec`` (as ``--variants --configs`` takes it; ``None``: the defaults) of our kernels
    of ``model``: a :class:`~loglin_edu.kernels.config.DeltaLaunchConfig` for ``"gated_deltanet"``, else a
    ``LaunchConfig``."""
    from ..kernels.config import DeltaLaunchConfig, LaunchConfig
    from .measure import config_from_spec

    kind = DeltaLaunchConfig if model == "gated_deltanet" else LaunchConfig
    return config_from_spec(spec, kind) if spec else kind()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.bench.profile",
                                     description="Device time of every kernel of one forward and one backward.")
    parser.add_argument("--model", choices=MODELS, default="loglinear_mamba2",
                        help="the benchmark setting and our kernels of log-linear Mamba-2 or of log-linear Gated "
                        "DeltaNet")
    parser.add_argument("--lengths", type=int, nargs="*", default=[1024, 65536])
    parser.add_argument("--only", nargs="*", help="implementations to profile (names of "
                        "loglin_edu.bench.implementations; default: PROFILED, the model's Triton kernels)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--config", help="a launch configuration of our kernels of --model, as python -m "
                        "loglin_edu.bench --variants --configs takes it (e.g. tree_registers=true, or "
                        "adjoint_value_tile=16 for gated_deltanet)")
    parser.add_argument("--out", type=Path, help=f"results JSON (default {DEFAULT_RESULTS}/kernels_profile_<device>"
                        ".json, kernels_gdn_profile_<device>.json for gated_deltanet)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("profiling needs a CUDA GPU")
    s = replace(SETTINGS[args.model, "gpu"], lengths=tuple(args.lengths))
    command = " ".join(sys.argv[1:] if argv is None else argv)
    result = provenance(f"python -m loglin_edu.bench.profile {command}", "cuda")
    result["setting"] = asdict(s)
    result["profiles"] = []
    prefix = "kernels_gdn" if args.model == "gated_deltanet" else "kernels"
    out = args.out or DEFAULT_RESULTS / f"{prefix}_profile_{device_slug()}.json"
    try:
        config = model_launch_config(args.model, args.config)
    except ValueError as error:
        parser.error(f"--config: {error}")
    result["config"] = asdict(config)  # our kernels' launch configuration: the defaults without --config
    for name in args.only or PROFILED[args.model]:
        result["profiles"] += profile_lengths(s, s.lengths, name, args.steps, config=config_of(name, args.model, config))
        result["compiled_kernels"] = compiled_kernels()
        write_json(out, result)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
