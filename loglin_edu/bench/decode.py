"""How fast and how small is decoding: one layer's operator step at long contexts, and its state's bytes.

    python -m loglin_edu.bench --decode [--tier gpu|cpu] [--contexts ...] [--batches ...] [--only ...]
                                        [--block-v ...] [--block-k ...] [--num-warps ...] [--out PATH]

For every batch ``B`` and context ``T`` the token decoded is the ``T``-th: ``T - 1`` tokens are in the
state before the step, ``T`` after. Only the operator's step is timed (no projections), on the GPU
replayed from a CUDA graph, median of many replays (:func:`loglin_edu.timing.median_ms`):

- ``loglinear``: the Triton decode kernel (:mod:`loglin_edu.kernels.decode_step`) as the layer runs it (on the
  lazy layout of a :class:`~loglin_edu.decoding.FenwickCache` ``[B, H, num_levels(T) - 1, K, V]`` fp32 with
  decay scales; the kernel's default schedule, value tile and warps) at position ``T - 1``: for ``T = 2^m`` the
  step reads the ``m`` live levels, every slot of the buffer — the fullest state a length-``T`` sequence holds.
  It is the buffer's last token: its carry empties those levels and has no slot to fill (the sum belongs to
  level ``m + 1``; :mod:`loglin_edu.decoding`), one tile less written than a step whose target the buffer has;
- ``loglinear_loop``, ``loglinear_unrolled``, ``loglinear_lazy``, ``loglinear_lazy_unrolled``: the same kernel
  with a runtime loop over the levels or the levels unrolled, on the eager layout (every live level rewritten
  to decay) or the lazy one, each at the fastest of the setting's value tiles; every kernel row also gives the
  bytes of levels and scales the step moves (:func:`~loglin_edu.kernels.decode_step.step_bytes`) and the rate
  they move at;
- ``loglinear_split``, ``loglinear_lazy_split``: the levels unrolled on slices of the key rows (the ``"split"``
  schedule, two launches), eager and lazy, at the fastest of the setting's value tiles and key slices
  (``--block-k``; by default the kernel's own slice);
- ``loglinear_torch``: the same step by :func:`~loglin_edu.decoding.lazy_fenwick_step` (PyTorch operations);
- ``mamba2``: Mamba-2's one state ``[B, H, K, V]`` (fp32), the Triton step kernel;
- ``attention``: softmax attention with a KV cache ``[B, H, T, V]`` (16-bit, head width ``V``): write the
  new key and value, then ``scaled_dot_product_attention`` over the cache; every SDPA backend PyTorch
  offers is timed and the fastest kept.

State bytes come from the allocator (``torch.cuda.memory_allocated()`` before and after allocating each
state; on a CPU, the tensors' sizes). A KV cache larger than ``--memory-limit`` GiB or than the free
memory is skipped, and the reason recorded. The goals the results are read against (``goals`` in the
JSON): the log-linear step within 2x the Mamba-2 step at every context, faster than attention with a
KV cache from 16K tokens on, and at most 20 states per head at 1M tokens (the levels ``1..20`` of the next
query; the lazy layout adds their decay scales, ``1/K`` of a state each).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..decoding import FenwickCache, lazy_fenwick_step
from ..fenwick import num_levels
from ..provenance import DEFAULT_RESULTS, device_slug, provenance, write_json
from ..timing import median_ms


@dataclass(frozen=True)
class DecodeSetting:
    """Shapes of one decode benchmark: ``heads`` heads, state ``key × value`` (Mamba-2's ``N × P``; the
    attention heads have width ``value``), inputs of ``dtype``, every batch at every context."""

    heads: int = 48
    key: int = 128
    value: int = 64
    dtype: str = "bfloat16"
    batches: tuple[int, ...] = (1, 64)
    contexts: tuple[int, ...] = (1024, 4096, 16384, 65536, 262144, 1048576)
    memory_limit_gib: float = 140.0
    block_v: tuple[int, ...] = (8, 16, 32, 64)  # V-tiles of the Triton steps: each is timed, the fastest kept
    num_warps: tuple[int | None, ...] = (None,)  # warps of the Triton steps, None their default: timed with each tile
    block_k: tuple[int | None, ...] = (None,)  # key rows of the split schedule's programs, None its default

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


GPU = DecodeSetting()
CPU = DecodeSetting(heads=2, key=16, value=16, dtype="float32", batches=(1, 2), contexts=(16, 64), block_v=(16,))
KERNEL_VARIANTS = {
    "loglinear": (None, True),
    "loglinear_loop": ("loop", False),
    "loglinear_unrolled": ("unrolled", False),
    "loglinear_lazy": ("loop", True),
    "loglinear_lazy_unrolled": ("unrolled", True),
    "loglinear_split": ("split", False),
    "loglinear_lazy_split": ("split", True),
}
"""The rows of the log-linear decode kernel: ``name -> (schedule, lazy layout)``. ``loglinear`` is the layer's
step: the lazy layout with the kernel's default schedule, value tile and warps (schedule ``None``), timed as it
is; the others fix a schedule and a layout and keep the fastest of the setting's tiles (and, for the split
schedule, key slices)."""
IMPLEMENTATIONS = (*KERNEL_VARIANTS, "loglinear_torch", "mamba2", "attention")


def allocated(make: Callable[[], dict[str, torch.Tensor]], device: torch.device) -> tuple[dict, int]:
    """``make()``'s tensors and the bytes they took: from the allocator on CUDA, their sizes elsewhere."""
    if device.type != "cuda":
        tensors = make()
        return tensors, sum(t.numel() * t.element_size() for t in tensors.values())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    tensors = make()
    torch.cuda.synchronize()
    return tensors, torch.cuda.memory_allocated() - before


def step_ms(step: Callable[[], object], device: torch.device, graph: bool = True) -> tuple[float, bool]:
    """Median ms of ``step()``; on CUDA replayed from a CUDA graph when it can be captured. Returns the
    time and whether a graph was used."""
    if device.type != "cuda" or not graph:
        return median_ms(step, device=device, repeats=3, warmup=1), False
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    try:
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            step()
    except RuntimeError:
        torch.cuda.synchronize()
        return median_ms(step, device=device), False
    return median_ms(cuda_graph.replay, device=device), True


def tile_name(block_v: int, num_warps: int | None, block_k: int | None) -> str:
    """``"16"``, ``"16/8w"`` for 8 warps asked for, ``"16/k32"`` for key slices of 32 rows asked for."""
    return str(block_v) + ("" if num_warps is None else f"/{num_warps}w") + ("" if block_k is None else f"/k{block_k}")


def fastest_tile(step: Callable[[int, int | None, int | None], object], s: DecodeSetting, device,
                 block_k: tuple[int | None, ...] = (None,)) -> dict:
    """Time ``step(block_v, num_warps, block_k)`` for every V-tile and warp count of the setting and every key
    slice of ``block_k``; the fastest, and every time (keyed by :func:`tile_name`). A tile the step refuses
    (:class:`~loglin_edu.kernels.decode_step.SliceRefused`: a split too fine for the lazy layout's value columns) is
    recorded with its reason; the step must take one, and any other error is raised."""
    from ..kernels.decode_step import SliceRefused

    times, refused = {}, {}
    for tile in [(bv, nw, bk) for bv in s.block_v for nw in s.num_warps for bk in block_k]:
        try:
            times[tile] = step_ms(lambda: step(*tile), device)
        except SliceRefused as error:
            refused[tile_name(*tile)] = str(error)[:300]
    if not times:
        raise ValueError(f"every tile was refused: {refused}")
    best = min(times, key=lambda tile: times[tile][0])
    timed = dict(step_ms=times[best][0], cuda_graph=times[best][1], block_v=best[0], num_warps=best[1],
                 block_v_ms={tile_name(*tile): t[0] for tile, t in times.items()})
    if best[2] is not None:
        timed["block_k"] = best[2]
    return timed | ({"refused_tiles": refused} if refused else {})


def warps(num_warps: int | None) -> dict:
    """The keyword of a Triton step's warp count: none for its default."""
    return {} if num_warps is None else {"num_warps": num_warps}


def key_rows(block_k: int | None) -> dict:
    """The keyword of the split schedule's key slice: none for its default."""
    return {} if block_k is None else {"block_k": block_k}


def step_inputs(B: int, s: DecodeSetting, levels: int, device, seed: int = 0) -> dict[str, torch.Tensor]:
    """One token's inputs: q, k ``[B, 1, K]`` (shared by the heads), v ``[B, H, V]``, λ ``[B, H, L]``,
    log decay ``[B, H]``, in the setting's dtype."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, offset=0.0, normal=True):
        x = torch.randn(*shape, generator=gen) if normal else torch.rand(*shape, generator=gen)
        return (x * scale + offset).to(device=device, dtype=s.torch_dtype)

    return dict(q=rand(B, 1, s.key, scale=s.key**-0.5), k=rand(B, 1, s.key, scale=s.key**-0.5),
                v=rand(B, s.heads, s.value), level_scales=rand(B, s.heads, levels, normal=False, offset=0.5),
                log_decay=rand(B, s.heads, scale=-0.1, normal=False))


def loglinear_cache(B: int, T: int, s: DecodeSetting, device, lazy: bool = False) -> tuple[FenwickCache, int]:
    """A :class:`FenwickCache` of ``T - 1`` tokens (random live levels, zeros elsewhere; in the lazy layout
    with random scales in ``[0.5, 1)``) and its bytes."""

    def make():
        cache = FenwickCache.empty(B, s.heads, s.key, s.value, max_len=T, device=device, lazy=lazy)
        tensors = {"levels": cache.levels, "position": cache.position}
        return tensors | ({"decay_scales": cache.decay_scales} if lazy else {})

    tensors, nbytes = allocated(make, device)
    cache = FenwickCache(tensors["levels"], tensors["position"], T, tensors.get("decay_scales"))
    cache.position.fill_(T - 1)
    live = cache.live()[0]
    cache.levels[:, :, live] = 0.01 * torch.randn(B, s.heads, int(live.sum()), s.key, s.value, device=device)
    if lazy:
        scales = 0.5 + 0.5 * torch.rand(B, s.heads, int(live.sum()), 1, device=device)
        cache.decay_scales[:, :, live] = scales.expand(-1, -1, -1, s.value)
    return cache, nbytes


def measure_loglinear(B: int, T: int, s: DecodeSetting, device, name: str) -> dict:
    """The log-linear step at position ``T - 1``: by the Triton kernel (a variant of
    :data:`KERNEL_VARIANTS`) or, for ``loglinear_torch``, by :func:`~loglin_edu.decoding.lazy_fenwick_step`."""
    schedule, lazy = KERNEL_VARIANTS.get(name, (None, True))
    cache, nbytes = loglinear_cache(B, T, s, device, lazy)
    x = step_inputs(B, s, cache.num_levels, device)
    if name in KERNEL_VARIANTS:
        from ..kernels.config import block
        from ..kernels.decode_step import (decode_step_, default_block_k, default_block_v, default_num_warps,
                                           default_schedule, step_bytes)

        def step(bv, nw, bk):
            return decode_step_(cache.levels, cache.position, x["q"], x["k"], x["v"], x["level_scales"],
                                x["log_decay"], decay_scales=cache.decay_scales, schedule=schedule, block_v=bv,
                                advance=False, **warps(nw), **key_rows(bk))

        if schedule is None:  # the layer's step, as it runs
            schedule = default_schedule(B, s.heads)
            ms, graph = step_ms(lambda: step(None, None, None), device)
            timed = dict(step_ms=ms, cuda_graph=graph, block_v=default_block_v(schedule, cache.stored_levels, s.value),
                         num_warps=None)
        else:
            timed = fastest_tile(step, s, device, s.block_k if schedule == "split" else (None,))
        if schedule == "split" and "block_k" not in timed:  # the kernel's own slice, recorded
            timed["block_k"] = default_block_k(s.key, s.value, timed["block_v"], lazy)
        if timed["num_warps"] is None:  # the kernel's own choice, recorded
            rows = timed.get("block_k", block(s.key))
            timed["num_warps"] = default_num_warps(schedule, cache.stored_levels, rows, timed["block_v"])
        moved = B * s.heads * step_bytes(T - 1, s.key, s.value, lazy, levels=cache.stored_levels)
        timed.update(schedule=schedule, layout="lazy" if lazy else "eager", moved_bytes=moved,
                     moved_gb_per_s=moved / timed["step_ms"] / 1e6)
    else:
        heads = (B, s.heads, s.key)
        ms, graph = step_ms(lambda: lazy_fenwick_step(
            cache.levels, cache.decay_scales, cache.position, x["q"].expand(heads), x["k"].expand(heads), x["v"],
            x["level_scales"], x["log_decay"]), device)
        timed = dict(step_ms=ms, cuda_graph=graph)
    live = [int(n) + 1 for n in cache.live()[0].nonzero().flatten()]  # level i + 1 in slot i
    return dict(timed, state_bytes=nbytes, levels=cache.stored_levels, live_levels_before=live,
                states_per_head=nbytes / (B * s.heads * s.key * s.value * 4))


def measure_mamba2(B: int, T: int, s: DecodeSetting, device) -> dict:
    """Mamba-2's one-state step (Triton kernel); the state's size does not depend on ``T``."""
    from ..kernels.decode_step import mamba2_decode_step_

    tensors, nbytes = allocated(lambda: {"state": torch.zeros(B, s.heads, s.key, s.value, device=device)}, device)
    state = tensors["state"].normal_(0, 0.01)
    x = step_inputs(B, s, 1, device)
    timed = fastest_tile(lambda bv, nw, _: mamba2_decode_step_(state, x["q"], x["k"], x["v"], x["log_decay"],
                                                               block_v=bv, **warps(nw)), s, device)
    return dict(timed, state_bytes=nbytes, states_per_head=1.0)


def kv_cache_bytes(B: int, T: int, s: DecodeSetting) -> int:
    """Bytes of keys and values ``[B, H, T, V]`` in the setting's dtype."""
    return 2 * B * s.heads * T * s.value * torch.finfo(s.torch_dtype).bits // 8


def sdpa_backends(device) -> list:
    """The SDPA backends to try (``None``: PyTorch's own choice)."""
    if device.type != "cuda":
        return [None]
    from torch.nn.attention import SDPBackend

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
    return [getattr(SDPBackend, name) for name in names if hasattr(SDPBackend, name)]


def measure_attention(B: int, T: int, s: DecodeSetting, device) -> dict:
    """Write the ``T``-th key and value into a KV cache of ``T`` positions and attend over all of them."""
    need = kv_cache_bytes(B, T, s)
    limit = s.memory_limit_gib * 2**30
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    if need > limit or (free is not None and need > 0.9 * free):
        where = f"the limit of {s.memory_limit_gib:g} GiB" if need > limit else f"90% of the free {free / 2**30:.1f} GiB"
        return dict(skipped=f"KV cache of {need / 2**30:.1f} GiB (B={B}, T={T}) exceeds {where}",
                    state_bytes_needed=need)
    shape = (B, s.heads, T, s.value)
    tensors, nbytes = allocated(lambda: {"keys": torch.empty(shape, device=device, dtype=s.torch_dtype),
                                         "values": torch.empty(shape, device=device, dtype=s.torch_dtype)}, device)
    keys, values = tensors["keys"].normal_(), tensors["values"].normal_()
    q, k_new, v_new = torch.randn(3, B, s.heads, 1, s.value, device=device, dtype=s.torch_dtype)

    def step():
        keys[:, :, T - 1 :].copy_(k_new)
        values[:, :, T - 1 :].copy_(v_new)
        return F.scaled_dot_product_attention(q, keys, values)

    times, errors = {}, {}
    for backend in sdpa_backends(device):
        name = "default" if backend is None else backend.name.lower()
        try:
            if backend is None:
                times[name] = step_ms(step, device)
            else:
                from torch.nn.attention import sdpa_kernel

                with sdpa_kernel([backend]):
                    times[name] = step_ms(step, device)
        except RuntimeError as error:
            errors[name] = f"{type(error).__name__}: {error}"[:300]
    del keys, values, tensors
    if not times:
        return dict(error=f"no SDPA backend ran: {errors}", state_bytes=nbytes)
    best = min(times, key=lambda n: times[n][0])
    return dict(step_ms=times[best][0], cuda_graph=times[best][1], backend=best, state_bytes=nbytes,
                backends_ms={n: t[0] for n, t in times.items()}, backend_errors=errors,
                states_per_head=nbytes / (B * s.heads * s.key * s.value * 4))


def measure(name: str, B: int, T: int, s: DecodeSetting, device) -> dict:
    """One row: implementation ``name`` at batch ``B`` and context ``T`` (errors are recorded, not raised)."""
    row = {"name": name, "batch": B, "context": T}
    try:
        if name == "attention":
            row.update(measure_attention(B, T, s, device))
        elif name == "mamba2":
            row.update(measure_mamba2(B, T, s, device))
        else:
            row.update(measure_loglinear(B, T, s, device, name))
    except (RuntimeError, ValueError) as error:  # e.g. out of memory: recorded, the run goes on
        row["error"] = f"{type(error).__name__}: {error}"[:500]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def goals(rows: list[dict], s: DecodeSetting) -> dict:
    """The results read against the goals (module docstring); ``None`` where a number is missing. The goal
    against Mamba-2 is read for the ``loglinear`` row and, under ``variants_within_2x_mamba2``, for every
    kernel variant measured."""
    times = {(r["name"], r["batch"], r["context"]): r.get("step_ms") for r in rows}
    cells = sorted({(r["batch"], r["context"]) for r in rows})

    def within_2x(name):
        def read(ours, mamba):
            return None if ours is None or mamba is None else {"ratio": ours / mamba, "met": ours <= 2 * mamba}

        return {f"B={B},T={T}": read(times.get((name, B, T)), times.get(("mamba2", B, T))) for B, T in cells}

    faster = {}
    for B, T in cells:
        ours, attention = times.get(("loglinear", B, T)), times.get(("attention", B, T))
        if T >= 16384:
            faster[f"B={B},T={T}"] = None if ours is None or attention is None else {
                "ratio": ours / attention, "met": ours < attention}
    measured = {r["name"] for r in rows}
    states = {f"B={r['batch']}": r.get("states_per_head") for r in rows
              if r["name"] == "loglinear" and r["context"] == 2**20}
    return {
        "loglinear_within_2x_mamba2": within_2x("loglinear"),
        "variants_within_2x_mamba2": {name: within_2x(name) for name in KERNEL_VARIANTS if name in measured},
        "loglinear_faster_than_kv_cache_from_16k": faster,
        "loglinear_states_per_head_at_1M": {"measured": states, "bound": num_levels(2**20) - 1,
                                            "scales_per_level": 1 / s.key},
    }


def table(rows: list[dict]) -> str:
    """A text table: step ms and state MiB per implementation, batch and context."""
    lines = [f"{'name':24s} {'B':>4s} {'T':>8s} {'step ms':>9s} {'state MiB':>10s}"]
    for r in rows:
        ms = f"{r['step_ms']:.4f}" if "step_ms" in r else r.get("skipped", r.get("error", ""))[:40]
        mib = f"{r['state_bytes'] / 2**20:.3f}" if "state_bytes" in r else "-"
        lines.append(f"{r['name']:24s} {r['batch']:4d} {r['context']:8d} {ms:>9s} {mib:>10s}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.bench --decode", description=__doc__.split("\n")[0])
    parser.add_argument("--tier", choices=("gpu", "cpu"), default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--contexts", type=int, nargs="*", help="contexts T (default: the tier's)")
    parser.add_argument("--batches", type=int, nargs="*", help="batch sizes (default: the tier's)")
    parser.add_argument("--only", nargs="*", choices=IMPLEMENTATIONS, help="implementations to run")
    parser.add_argument("--block-v", type=int, nargs="*", help="V-tiles of the Triton steps (default: the tier's)")
    parser.add_argument("--num-warps", type=int, nargs="*", help="warps of the Triton steps (default: each kernel's own)")
    parser.add_argument("--block-k", type=int, nargs="*",
                        help="key rows of the split schedule's programs (default: the kernel's own)")
    parser.add_argument("--memory-limit", type=float, help="GiB a KV cache may take (default 140)")
    parser.add_argument("--out", type=Path, help=f"results JSON (default {DEFAULT_RESULTS}/decode_<device>.json)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    s = GPU if args.tier == "gpu" else CPU
    s = replace(s, contexts=tuple(args.contexts or s.contexts), batches=tuple(args.batches or s.batches),
                block_v=tuple(args.block_v or s.block_v), num_warps=tuple(args.num_warps or s.num_warps),
                block_k=tuple(args.block_k or s.block_k))
    if args.memory_limit is not None:
        s = replace(s, memory_limit_gib=args.memory_limit)
    device = torch.device("cuda" if args.tier == "gpu" else "cpu")
    if device.type == "cpu" and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # this program's own process: the interpreter on a CPU
    command = "python -m loglin_edu.bench --decode " + " ".join(sys.argv[1:] if argv is None else argv)
    result = provenance(command, device)
    result["setting"] = asdict(s)
    out = args.out or DEFAULT_RESULTS / f"decode_{device_slug(device)}.json"
    names = args.only or IMPLEMENTATIONS
    cells = [(name, B, T) for B in s.batches for T in s.contexts for name in names]
    if not args.quiet:
        from tqdm.auto import tqdm

        cells = tqdm(cells, desc="decode steps")
    rows = []
    for name, B, T in cells:
        rows.append(measure(name, B, T, s, device))
        result["rows"], result["goals"] = rows, goals(rows, s)
        result["complete"] = len(rows) == len(names) * len(s.batches) * len(s.contexts)
        write_json(out, result)
    print(table(rows))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
