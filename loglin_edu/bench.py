"""How fast is it: log-linear Mamba-2 kernels against SDPA flash, linear Mamba-2 and fla-core.

    python -m loglin_edu.bench                     # GPU tier: PAPER.md §7's setting -> book/results/kernels_<device>.json
    python -m loglin_edu.bench --tier cpu --out /tmp/bench.json   # tiny, under Triton's interpreter
    python -m loglin_edu.bench --accuracy          # errors of every output and gradient against float64
    python -m loglin_edu.bench --variants          # our kernel under several launch configurations

The GPU setting: ``B·T = 65,536`` tokens, 48 heads, state ``K = 128``, head dim ``V = 64``, q and k shared
by the heads, bf16, ``T`` from 1K to 64K. Each implementation runs in this one process on the same
inputs; times are medians of ``triton.testing.do_bench`` (CUDA events, L2 flushed between runs),
memory is the peak allocated during one forward+backward above what the inputs hold.

The counted work of our schedule (:func:`counted_work`) and the bytes every implementation must move
give the floor: ``max(flops / 790 TFLOP/s, bytes / 4.3 TB/s)``, the two ceilings measured on an H200.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

MATMUL_FLOPS = 790e12  # bf16 dense products on an H200, measured (PAPER.md §7, device notes)
COPY_BYTES = 4.3e12  # device-to-device copy on an H200, bytes read + written per second, measured


@dataclass(frozen=True)
class Setting:
    """One benchmark setting: ``B = tokens // T`` sequences of ``T`` tokens for every ``T`` in lengths."""

    tokens: int = 65536
    heads: int = 48
    key: int = 128
    value: int = 64
    dtype: str = "bfloat16"
    lengths: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
    chunk_size: int = 64

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


GPU = Setting()
CPU = Setting(tokens=128, heads=2, key=16, value=16, dtype="float32", lengths=(32, 64, 128), chunk_size=16)


def make_inputs(B: int, T: int, s: Setting, device, seed: int = 0) -> dict:
    """Mamba-2-like inputs: q, k ``[B, T, 1, K]`` (shared) scaled by ``K^-1/2``, v ``[B, T, H, V]``,
    λ ``[B, T, H, L]`` in (0.5, 1.5), log decay in (-0.1, 0)."""
    from .fenwick import num_levels

    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0, offset=0.0, normal=True):
        x = torch.randn(*shape, generator=gen) if normal else torch.rand(*shape, generator=gen)
        return (x * scale + offset).to(device=device, dtype=s.torch_dtype)

    return dict(
        q=rand(B, T, 1, s.key, scale=s.key**-0.5),
        k=rand(B, T, 1, s.key, scale=s.key**-0.5),
        v=rand(B, T, s.heads, s.value),
        level_scales=rand(B, T, s.heads, num_levels(T), normal=False, offset=0.5),
        log_decay=rand(B, T, s.heads, scale=-0.1, normal=False),
    )


def counted_work(B: int, T: int, s: Setting) -> dict:
    """Matrix-product flops of our schedule (forward, backward) and the fewest bytes any implementation
    moves (inputs read once, outputs written once), for ``B`` sequences of ``T`` tokens."""
    C, H, K, V = s.chunk_size, s.heads, s.key, s.value
    N = -(-T // C)
    reads = sum(bin(c).count("1") for c in range(N)) * C  # token-level reads of a node, per sequence and head
    per_head = B * H
    leaves = 2 * T * K * V
    intra = 2 * T * C * (K + V)
    level_reads = 2 * reads * K * V
    forward = per_head * (leaves + intra + level_reads)
    # backward: node gradients (= level reads), dq (intra 3 products + level reads), dk/dv (intra 4 + 2 leaf products)
    backward = per_head * (level_reads + (2 * T * C * (2 * K + V) + level_reads) + (2 * T * C * (2 * K + 2 * V) + 2 * leaves))
    size = torch.finfo(s.torch_dtype).bits // 8
    L = (T - 1).bit_length() + 1
    inputs = B * T * (2 * K + H * (V + L + 1)) * size
    outputs = B * T * H * V * size
    return dict(
        forward_flops=forward,
        backward_flops=backward,
        forward_bytes=inputs + outputs,
        backward_bytes=2 * (inputs + outputs),  # read inputs and dO, write every gradient
    )


def floor_ms(work: dict, backward: bool) -> float:
    """The arithmetic/memory floor in ms: the larger of flops over the matrix rate and bytes over bandwidth."""
    flops = work["forward_flops"] + (work["backward_flops"] if backward else 0)
    nbytes = work["forward_bytes"] + (work["backward_bytes"] if backward else 0)
    return 1e3 * max(flops / MATMUL_FLOPS, nbytes / COPY_BYTES)


# --- the implementations -------------------------------------------------------------------------


def _ours(inputs, config=None):
    from .kernels.loglinear_mamba2 import loglinear_mamba2

    x = inputs
    return loglinear_mamba2(x["q"], x["k"], x["v"], x["level_scales"], x["log_decay"], config=config)


def _ours_linear(inputs):
    from .kernels.mamba2_chunked import mamba2_triton

    x = inputs
    return mamba2_triton(x["q"], x["k"], x["v"], x["log_decay"])


def _torch_chunkwise(inputs):
    from .loglinear import loglinear_attention

    x = inputs
    return loglinear_attention(x["q"], x["k"], x["v"], x["level_scales"], x["log_decay"], form="chunkwise", chunk_size=16)


def _sdpa(inputs):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = inputs["sdpa"]
    backend = SDPBackend.FLASH_ATTENTION if q.is_cuda else SDPBackend.MATH
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _fla_loglinear(inputs):
    from fla.ops.log_linear_attn import chunk_log_linear_attn

    x = inputs
    return chunk_log_linear_attn(x["q"], x["k"], x["v"], x["log_decay"], x["level_scales"], scale=1.0)[0]


def _fla_simple_gla(inputs):
    from fla.ops.simple_gla import chunk_simple_gla

    x = inputs
    q, k = x["q_heads"]
    return chunk_simple_gla(q, k, x["v"], g=x["log_decay"], scale=1.0)[0]


IMPLEMENTATIONS = {  # name -> (function of the inputs, the inputs it differentiates)
    "loglinear (ours, triton)": (_ours, ("q", "k", "v", "level_scales", "log_decay")),
    "loglinear (torch chunkwise)": (_torch_chunkwise, ("q", "k", "v", "level_scales", "log_decay")),
    "mamba2 linear (ours, triton step 1)": (_ours_linear, ("q", "k", "v", "log_decay")),
    "sdpa (causal, flash on GPU)": (_sdpa, ("sdpa",)),
    "fla chunk_log_linear_attn": (_fla_loglinear, ("q", "k", "v", "level_scales", "log_decay")),
    "fla chunk_simple_gla (linear mamba2)": (_fla_simple_gla, ("q_heads", "v", "log_decay")),
}
CPU_ONLY = ("loglinear (torch chunkwise)",)
GPU_ONLY = ("fla chunk_log_linear_attn", "fla chunk_simple_gla (linear mamba2)")


def _leaves(inputs, names):
    out = []
    for name in names:
        value = inputs[name]
        out.extend(value if isinstance(value, tuple) else [value])
    return out


def _timer(fn, device, grads) -> float:
    """Median ms: ``do_bench`` on a GPU, a few wall-clock runs on the CPU."""
    if device.type == "cuda":
        import triton

        return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grads, return_mode="median")
    times = []
    for _ in range(3):
        for g in grads:
            g.grad = None
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


def measure(name: str, inputs: dict, device, fn=None) -> dict:
    """Forward and forward+backward median ms and peak extra memory (MiB) of one implementation
    (``fn`` replaces the registered function, keeping its inputs)."""
    registered, names = IMPLEMENTATIONS[name]
    fn = fn or registered
    leaves = _leaves(inputs, names)
    row = {"name": name}
    try:
        with torch.no_grad():
            fn(inputs)
        row["forward_ms"] = _timer(lambda: fn(inputs), device, [])
    except Exception as error:  # a baseline that cannot run here is recorded, not fatal
        row["error"] = f"forward: {type(error).__name__}: {error}"[:500]
        return row
    for leaf in leaves:
        leaf.requires_grad_(True)
    try:
        do = torch.randn_like(fn(inputs))

        def step():
            fn(inputs).backward(do)

        step()
        row["forward_backward_ms"] = _timer(step, device, leaves)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            row["peak_memory_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    except Exception as error:
        row["error"] = f"backward: {type(error).__name__}: {error}"[:500]
    finally:
        for leaf in leaves:
            leaf.requires_grad_(False)
            leaf.grad = None
    return row


def prepare(B: int, T: int, s: Setting, device) -> dict:
    inputs = make_inputs(B, T, s, device)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    inputs["q_heads"] = tuple(x.expand(-1, -1, s.heads, -1).contiguous() for x in (q, k))
    sdpa_qk = torch.randn(2, B, s.heads, T, s.value, device=device, dtype=s.torch_dtype)
    inputs["sdpa"] = (sdpa_qk[0], sdpa_qk[1], v.transpose(1, 2).contiguous())
    return inputs


# --- accuracy ------------------------------------------------------------------------------------

ACCURACY_SHAPES = (  # (B, T, H, Hk, K, V): per-head and shared q/k, T off the chunk grid, long sequences
    (2, 1000, 4, 4, 64, 64),
    (3, 333, 3, 1, 40, 24),
    (1, 4096, 8, 1, 128, 64),
    (1, 65536, 2, 1, 128, 64),
)


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖x - ref‖ / ‖ref‖`` in fp64."""
    x, ref = x.double(), ref.double()
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300)).item()


def accuracy(shape, dtype: torch.dtype, device, seed: int = 0, config=None) -> dict:
    """Relative errors of o and every gradient of ``loglinear_mamba2`` in ``dtype`` against the package's
    chunkwise form in float64 on the same (rounded) inputs."""
    from .fenwick import num_levels
    from .kernels.loglinear_mamba2 import loglinear_mamba2
    from .loglinear import loglinear_attention

    B, T, H, Hk, K, V = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    raw = [
        torch.randn(B, T, Hk, K, generator=gen) * K**-0.5,
        torch.randn(B, T, Hk, K, generator=gen) * K**-0.5,
        torch.randn(B, T, H, V, generator=gen),
        0.5 + torch.rand(B, T, H, num_levels(T) + 1, generator=gen),
        -0.1 * torch.rand(B, T, H, generator=gen),
    ]
    low = [x.to(device=device, dtype=dtype).requires_grad_(True) for x in raw]
    high = [x.detach().double().requires_grad_(True) for x in low]
    out = loglinear_mamba2(*low, config=config)
    weights = torch.randn(out.shape, generator=gen).to(device=device, dtype=dtype)  # dO, in the inputs' dtype
    grads = torch.autograd.grad((out.float() * weights.float()).sum(), low)
    ref = loglinear_attention(*high, form="chunkwise", chunk_size=64)
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), high)
    names = ("o", "dq", "dk", "dv", "dlevel_scales", "dlog_decay")
    errors = [relative_error(out, ref)] + [relative_error(g, r) for g, r in zip(grads, ref_grads)]
    return {"shape": dict(zip("B T H Hk K V".split(), shape)), "dtype": str(dtype).replace("torch.", ""),
            "errors": dict(zip(names, errors))}


# --- the run -------------------------------------------------------------------------------------


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    from importlib.metadata import PackageNotFoundError, version

    for name in ("triton", "fla-core", "numpy"):  # read from metadata: importing fla changes process state
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        out["device"] = torch.cuda.get_device_name()
    return out


def git_commit() -> str:
    """``LOGLIN_COMMIT`` when set (a copy of the tree whose ``.git`` is missing or stale), else ``git rev-parse HEAD``."""
    if os.environ.get("LOGLIN_COMMIT"):
        return os.environ["LOGLIN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def device_slug() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    for known in ("h200", "h100", "a100", "l4", "t4"):
        if known in name:
            return known
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def benchmark(s: Setting, names, device, progress=True, on_row=None) -> list[dict]:
    """Every implementation of ``names`` at every length of ``s``; ``on_row(rows)`` after each measurement
    (the CLI rewrites its results file then, so a run stopped early keeps what it measured)."""
    from tqdm.auto import tqdm

    rows = []
    jobs = [(T, name) for T in s.lengths for name in names]
    bar = tqdm(jobs, disable=not progress, desc="bench")
    current = None
    for T, name in bar:
        bar.set_postfix_str(f"T={T} {name}")
        if current != T:
            inputs, current = prepare(s.tokens // T, T, s, device), T
        row = measure(name, inputs, device)
        row.update(T=T, B=s.tokens // T)
        rows.append(row)
        if on_row is not None:
            on_row(rows)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def variants(s: Setting, lengths, configs, device) -> list[dict]:
    """Our kernel under each launch configuration: forward and forward+backward median ms."""
    rows = []
    for T in lengths:
        inputs = prepare(s.tokens // T, T, s, device)
        for config in configs:
            row = measure("loglinear (ours, triton)", inputs, device, fn=lambda x, c=config: _ours(x, c))
            row.update(T=T, config=asdict(config))
            rows.append(row)
            print(f"T={T:6d} {config} fwd {row.get('forward_ms', float('nan')):.2f} ms  "
                  f"fwd+bwd {row.get('forward_backward_ms', float('nan')):.2f} ms {row.get('error', '')}", flush=True)
    return rows


def precision_ladder(s: Setting, lengths, device) -> list[dict]:
    """Every rung of ``LaunchConfig.precision`` at each length: the setting's forward and forward+backward
    time, and the errors against float64 of one sequence (B = 1, 2 heads, shared q/k, the setting's K, V
    and dtype) — what choosing a default by T needs."""
    from .kernels._common import PRECISIONS, LaunchConfig

    rows = []
    for T in lengths:
        inputs = prepare(s.tokens // T, T, s, device)
        for precision in PRECISIONS:
            config = LaunchConfig(precision=precision)
            row = measure("loglinear (ours, triton)", inputs, device, fn=lambda x, c=config: _ours(x, c))
            errors = accuracy((1, T, 2, 1, s.key, s.value), s.torch_dtype, device, config=config)["errors"]
            row.update(T=T, precision=precision, errors=errors)
            rows.append(row)
            print(f"T={T:6d} {precision:6s} fwd {row.get('forward_ms', float('nan')):.2f} ms  fwd+bwd "
                  f"{row.get('forward_backward_ms', float('nan')):.2f} ms  d log_decay {errors['dlog_decay']:.1e}  "
                  f"others <= {max(e for n, e in errors.items() if n != 'dlog_decay'):.1e} {row.get('error', '')}",
                  flush=True)
        del inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def summary_table(rows: list[dict], s: Setting) -> str:
    names = list(dict.fromkeys(r["name"] for r in rows))
    lines = ["fwd+bwd ms (fwd ms)   " + " | ".join(f"T={T}" for T in s.lengths)]
    for name in names:
        cells = []
        for T in s.lengths:
            row = next((r for r in rows if r["name"] == name and r["T"] == T), {})
            if "forward_backward_ms" in row:
                cells.append(f"{row['forward_backward_ms']:.1f} ({row['forward_ms']:.1f})")
            elif "forward_ms" in row:
                cells.append(f"- ({row['forward_ms']:.1f})")
            else:
                cells.append("n/a")
        lines.append(f"{name[:36]:36s} " + " | ".join(cells))
    floors = [floor_ms(counted_work(s.tokens // T, T, s), True) for T in s.lengths]
    lines.append(f"{'floor (counted work)':36s} " + " | ".join(f"{f:.2f}" for f in floors))
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Forward+backward ms against T for every implementation, with the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = Setting(**{**result["setting"], "lengths": tuple(result["setting"]["lengths"])})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in dict.fromkeys(r["name"] for r in result["rows"]):
        pts = [(r["T"], r["forward_backward_ms"]) for r in result["rows"] if r["name"] == name and "forward_backward_ms" in r]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.plot(s.lengths, [floor_ms(counted_work(s.tokens // T, T, s), True) for T in s.lengths], "k--", label="floor (counted work)")
    ax.set(xscale="log", yscale="log", xlabel="sequence length T (B·T fixed)", ylabel="forward+backward, median ms",
           title=f"{result['versions'].get('device', 'cpu')}, {s.dtype}, {s.heads} heads, K={s.key}, V={s.value}")
    ax.set_xticks(s.lengths, [f"{T // 1024}K" if T >= 1024 else str(T) for T in s.lengths])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def with_floor(row: dict, s: Setting) -> dict:
    """``row`` with the counted work, the floor and (when timed) the fraction of the floor reached."""
    work = counted_work(row["B"], row["T"], s)
    row = {**row, **work, "floor_forward_ms": floor_ms(work, False), "floor_forward_backward_ms": floor_ms(work, True)}
    if "forward_backward_ms" in row:
        row["fraction_of_floor"] = row["floor_forward_backward_ms"] / row["forward_backward_ms"]
    return row


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as JSON through a temporary file (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", choices=("gpu", "cpu"), default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", type=int, nargs="*", help="sequence lengths (default: the tier's)")
    parser.add_argument("--only", nargs="*", help="implementations to run (substrings of their names)")
    parser.add_argument("--out", type=Path, help="results JSON (default book/results/kernels_<device>.json)")
    parser.add_argument("--accuracy", action="store_true", help="measure errors against float64 instead of speed")
    parser.add_argument("--variants", action="store_true", help="time our kernel under several launch configurations")
    parser.add_argument("--precision", action="store_true",
                        help="time and measure the errors of every rung of LaunchConfig.precision at each length")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    results_dir = Path(__file__).resolve().parent.parent / "book" / "results"
    s = GPU if args.tier == "gpu" else CPU
    if args.lengths:
        s = Setting(**{**asdict(s), "lengths": tuple(args.lengths)})
    device = torch.device("cuda" if args.tier == "gpu" else "cpu")
    if device.type == "cpu":
        from . import kernels  # noqa: F401  (selects Triton's interpreter before triton is imported)
    result = {
        "command": "python -m loglin_edu.bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "setting": asdict(s),
    }
    mode = "accuracy" if args.accuracy else "precision_ladder" if args.precision else "variants" if args.variants else None
    out = args.out or results_dir / f"kernels_{mode + '_' if mode else ''}{device_slug()}.json"
    if args.accuracy:
        shapes = ACCURACY_SHAPES if device.type == "cuda" else ((1, 40, 2, 1, 16, 16),)
        dtypes = (torch.float32, torch.float16, torch.bfloat16) if device.type == "cuda" else (torch.float32,)
        result["accuracy"] = [accuracy(shape, dt, device) for shape in shapes for dt in dtypes]
        for r in result["accuracy"]:
            print(r["dtype"], r["shape"], {k: f"{v:.1e}" for k, v in r["errors"].items()}, flush=True)
    elif args.precision:
        result["precision"] = precision_ladder(s, s.lengths, device)
    elif args.variants:
        from .kernels._common import LaunchConfig

        configs = [LaunchConfig(head_group=g, block_levels=m, num_warps=w, tree_warps=tw)
                   for g, m, w, tw in ((1, 4, 4, 4), (8, 4, 4, 4), (8, 4, 8, 4), (48, 4, 8, 4), (8, 3, 4, 8))]
        result["variants"] = variants(s, s.lengths, configs, device)
    else:
        names = [n for n in IMPLEMENTATIONS if n not in (GPU_ONLY if device.type == "cpu" else CPU_ONLY)]
        if args.only:
            names = [n for n in names if any(o in n for o in args.only)]

        def save(rows):
            result["rows"] = [with_floor(row, s) for row in rows]
            result["complete"] = len(rows) == len(names) * len(s.lengths)
            write_json(out, result)
            row = rows[-1]
            print(f"T={row['T']:6d} {row['name']}: fwd {row.get('forward_ms', float('nan')):.2f} ms, "
                  f"fwd+bwd {row.get('forward_backward_ms', float('nan')):.2f} ms {row.get('error', '')}", flush=True)

        benchmark(s, names, device, progress=not args.quiet, on_row=save)
    write_json(out, result)
    if "rows" in result:
        plot(result, out.with_suffix(".png"))
        print(summary_table(result["rows"], s))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
