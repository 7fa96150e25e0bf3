"""Timing the implementations: forward and forward+backward medians and peak memory, over the setting's lengths."""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import fields as dataclass_fields

import torch

from ..timing import median_ms
from .accuracy import accuracy, delta_accuracy
from .implementations import IMPLEMENTATIONS, ours, ours_gated_deltanet, ours_linear_parallel
from .settings import Setting, prepare


def _leaves(inputs, names):
    out = []
    for name in names:
        value = inputs[name]
        out.extend(value if isinstance(value, tuple) else [value])
    return out


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
        row["forward_ms"] = median_ms(lambda: fn(inputs), device=device, repeats=3, warmup=0)
    except ImportError as error:  # a baseline whose library is not installed here
        row["skipped"] = f"not installed: {error}"[:500]
        return row
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
        row["forward_backward_ms"] = median_ms(step, device=device, repeats=3, warmup=0, grads=leaves)
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


def ours_of(s: Setting):
    """``(name, function(inputs, config))`` of our kernel for the setting's model."""
    if s.model == "gated_deltanet":
        return "loglinear gated deltanet (ours, triton)", ours_gated_deltanet
    return "loglinear (ours, triton)", ours


POSITIONAL_FIELDS = {
    "LaunchConfig": ("head_group", "block_levels", "num_warps", "tree_warps"),
    "DeltaLaunchConfig": ("value_tile", "grad_value_tile", "walk_warps", "grad_warps", "num_stages"),
    "LinearLaunchConfig": ("block_chunks", "key_split", "num_warps", "num_stages"),
}
"""The fields a comma-separated list of integers gives, in order, for each kind of launch configuration."""


def config_from_spec(spec: str, kind):
    """A launch configuration of class ``kind`` from the command line: integers for its
    :data:`POSITIONAL_FIELDS` in order (``"8,3,4,8"``), or ``"field=value,..."`` with any of its fields
    (``true``/``false``, ``none``, integers, or text), e.g. ``"tree_registers=true,tree_key_split=2"``."""
    positional = POSITIONAL_FIELDS[kind.__name__]
    expected = f"{','.join(positional)} (integers) or field=value pairs"
    if "=" not in spec:
        try:
            parts = [int(x) for x in spec.split(",")]
        except ValueError:
            raise ValueError(f"a launch configuration is {expected}, got {spec!r}") from None
        if len(parts) != len(positional):
            raise ValueError(f"a launch configuration is {expected}, got {spec!r}")
        return kind(**dict(zip(positional, parts)))

    def value(text: str):
        words = {"true": True, "false": False, "none": None}
        if text.lower() in words:
            return words[text.lower()]
        return int(text) if text.lstrip("-").isdigit() else text

    items = [item.split("=", 1) for item in spec.split(",")]
    if any(len(item) != 2 for item in items):
        raise ValueError(f"a launch configuration is {expected}, got {spec!r}")
    fields = {name.strip(): value(text.strip()) for name, text in items}
    unknown = sorted(set(fields) - {f.name for f in dataclass_fields(kind)})
    if unknown:
        raise ValueError(f"{kind.__name__} has no field {', '.join(unknown)} (got {spec!r})")
    return kind(**fields)


def variants(s: Setting, lengths, configs, device, linear: bool = False, on_row=None) -> list[dict]:
    """Our kernel under each launch configuration: forward and forward+backward median ms. ``linear``: the
    chunk-parallel linear Mamba-2 (kernel step 1b) under each ``LinearLaunchConfig`` instead. ``on_row(rows)``,
    if given, is called with the rows so far after each one (a results file then survives a stopped run)."""
    rows = []
    name, kernel = ("mamba2 linear (ours, triton chunk-parallel)", ours_linear_parallel) if linear else ours_of(s)
    for T in lengths:
        inputs = prepare(s.tokens // T, T, s, device)
        for config in configs:
            row = measure(name, inputs, device, fn=lambda x, c=config: kernel(x, c))
            row.update(T=T, config=asdict(config))
            rows.append(row)
            if on_row is not None:
                on_row(rows)
            print(f"T={T:6d} {config} fwd {row.get('forward_ms', float('nan')):.2f} ms  "
                  f"fwd+bwd {row.get('forward_backward_ms', float('nan')):.2f} ms {row.get('error', '')}", flush=True)
        del inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def precision_ladder(s: Setting, lengths, device) -> list[dict]:
    """Every rung of ``LaunchConfig.precision`` at each length: the setting's forward and forward+backward
    time, and the errors against float64 of one sequence (B = 1, 2 heads, shared q/k, the setting's K, V
    and dtype) — what choosing a default by T needs."""
    from ..kernels.config import DELTA_PRECISIONS, PRECISIONS, DeltaLaunchConfig, LaunchConfig

    delta = s.model == "gated_deltanet"
    name, kernel = ours_of(s)
    rows = []
    for T in lengths:
        inputs = prepare(s.tokens // T, T, s, device)
        for precision in DELTA_PRECISIONS if delta else PRECISIONS:
            config = DeltaLaunchConfig(precision=precision) if delta else LaunchConfig(precision=precision)
            row = measure(name, inputs, device, fn=lambda x, c=config: kernel(x, c))
            if delta:
                errors = delta_accuracy((1, T, 2, 2, s.key, s.value), s.torch_dtype, device, config=config)["errors"]
            else:
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
