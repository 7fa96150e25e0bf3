"""A failing GPU kernel, stage by stage: each case of the log-linear kernels in its own process.

    python -m loglin_edu.bench.diagnose              # every case; a failing case does not stop the rest
    python -m loglin_edu.bench.diagnose case DTYPE SHARED B T H K V HEAD_GROUP
    python -m loglin_edu.bench.diagnose delta        # the log-linear Gated DeltaNet kernels, case by case
    python -m loglin_edu.bench.diagnose delta-case DTYPE SHARED B T H K V
    SANITIZE=1 python -m loglin_edu.bench.diagnose   # and the first failing case under compute-sanitizer

An illegal memory access poisons the whole CUDA context, so each case runs in a subprocess with
``CUDA_LAUNCH_BLOCKING=1`` and a synchronisation after every stage: the last stage printed names the
kernel. Each case also compares o and every gradient with the float64 chunkwise form.
"""

from __future__ import annotations

import os
import subprocess
import sys

CASES = [  # dtype, shared q/k, B, T, H, K, V, head group
    ("float32", 0, 2, 1000, 4, 64, 64, 8),
    ("float32", 0, 2, 1000, 4, 64, 64, 1),
    ("float32", 1, 2, 1000, 4, 64, 64, 8),
    ("float32", 1, 1, 1024, 4, 128, 64, 1),
    ("bfloat16", 0, 2, 1000, 4, 64, 64, 8),
    ("bfloat16", 1, 2, 1000, 4, 64, 64, 8),
    ("bfloat16", 1, 1, 4096, 4, 128, 64, 1),
]


def run_case(dtype: str, shared: int, B: int, T: int, H: int, K: int, V: int, group: int) -> list[float]:
    """Run one case stage by stage (printing each stage as it completes); returns the relative errors of
    o, dq, dk, dv, dλ against the float64 chunkwise form."""
    import torch

    from ..kernels.config import LaunchConfig
    from ..kernels.inputs import chunk_decay
    from ..kernels.step3_chunk_tree import build_tree, loglinear_forward
    from ..kernels.step4_tree_backward import loglinear_backward
    from ..ops import loglinear_attention
    from .accuracy import accuracy_inputs, relative_error

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test under the interpreter
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    q, k, v, lam, g = (x.to(device, dt) for x in accuracy_inputs((B, T, H, 1 if shared else H, K, V), gen))
    config = LaunchConfig(head_group=group)

    def stage(name, fn):
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        print(f"  {name}: ok", flush=True)
        return out

    gc, gend = stage("chunk_decay", lambda: chunk_decay(g, B, T, H, 64, q.device, dt))
    stage("build_tree", lambda: build_tree(k, v, gc, gend, 64, config))
    o, tree = stage("forward", lambda: loglinear_forward(q, k, v, lam, gc, gend, 64, config))
    print(f"  non-finite: o {(~o.isfinite()).sum().item()}, nodes {(~tree.nodes.isfinite()).sum().item()}", flush=True)
    do = torch.randn(o.shape, generator=gen).to(device, dt)
    dq, dk, dv, dlam, _ = stage("backward", lambda: loglinear_backward(q, k, v, lam, gc, gend, tree, do, 64, config))
    high = [x.double().requires_grad_(True) for x in (q, k, v, lam)]
    ref = loglinear_attention(*high, g.double(), form="chunkwise")
    ref_grads = torch.autograd.grad((ref * do.double()).sum(), high)
    errors = [relative_error(o, ref)] + [relative_error(a, b) for a, b in zip((dq, dk, dv, dlam), ref_grads)]
    print("  errors o, dq, dk, dv, dlam: " + " ".join(f"{e:.1e}" for e in errors), flush=True)
    return errors


DELTA_CASES = [  # dtype, shared q/k, B, T, H, K, V
    ("float32", 0, 2, 1000, 4, 64, 64),
    ("bfloat16", 0, 2, 1000, 4, 64, 64),
    ("bfloat16", 1, 3, 333, 3, 40, 24),
    ("bfloat16", 0, 1, 2048, 2, 192, 384),
    ("bfloat16", 0, 1, 4096, 2, 256, 256),
]


def run_delta_case(dtype: str, shared: int, B: int, T: int, H: int, K: int, V: int) -> list[float]:
    """The log-linear Gated DeltaNet kernels stage by stage (steps 6, 7, 8; each stage printed as it completes);
    returns the relative errors of o, dq, dk, dv, dλ, dβ against the float64 chunkwise form."""
    import torch

    from ..kernels.step6_delta_chunks import delta_chunks
    from ..kernels.step7_delta_levels import level_states, loglinear_delta_forward
    from ..kernels.step8_delta_backward import loglinear_delta_backward
    from ..ops import loglinear_attention
    from .accuracy import delta_accuracy_inputs, relative_error

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test under the interpreter
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    q, k, v, lam, g, beta = (x.to(device, dt) for x in delta_accuracy_inputs((B, T, H, 1 if shared else H, K, V), gen))

    def stage(name, fn):
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        print(f"  {name}: ok", flush=True)
        return out

    chunks = stage("step 6: delta_chunks", lambda: delta_chunks(q, k, v, beta, g, 64))
    stage("step 7: level_states", lambda: level_states(k, chunks, T, V, 64))
    o, chunks, states = stage("step 7: forward", lambda: loglinear_delta_forward(q, k, v, lam, beta, g, 64))
    print(f"  non-finite: o {(~o.isfinite()).sum().item()}, states {(~states.isfinite()).sum().item()}", flush=True)
    do = torch.randn(o.shape, generator=gen).to(device, dt)
    dq, dk, dv, dlam, dbeta, _ = stage("step 8: backward",
                                       lambda: loglinear_delta_backward(q, k, v, lam, chunks, states, do, 64))
    high = [x.double().requires_grad_(True) for x in (q, k, v, lam, g, beta)]
    ref = loglinear_attention(*high, form="chunkwise")
    ref_grads = torch.autograd.grad((ref * do.double()).sum(), high)
    errors = [relative_error(o, ref)] + [relative_error(a, b) for a, b in
                                         zip((dq, dk, dv, dlam, dbeta), [*ref_grads[:4], ref_grads[5]])]
    print("  errors o, dq, dk, dv, dlam, dbeta: " + " ".join(f"{e:.1e}" for e in errors), flush=True)
    return errors


def main(argv: list[str]) -> None:
    if argv[:1] == ["case"]:
        dtype, *numbers = argv[1:]
        run_case(dtype, *map(int, numbers))
        return
    if argv[:1] == ["delta-case"]:
        dtype, *numbers = argv[1:]
        run_delta_case(dtype, *map(int, numbers))
        return
    delta = argv[:1] == ["delta"]
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    failed = []
    for case in DELTA_CASES if delta else CASES:
        print(f"case {case}", flush=True)
        cmd = [sys.executable, "-m", "loglin_edu.bench.diagnose", "delta-case" if delta else "case", *map(str, case)]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        print(result.stdout, end="", flush=True)
        if result.returncode:
            failed.append(case)
            last = result.stderr.strip().splitlines()[-1][:300] if result.stderr.strip() else ""
            print(f"  FAILED: {last}", flush=True)
    if failed and os.environ.get("SANITIZE"):
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "5", sys.executable, "-m",
               "loglin_edu.bench.diagnose", "delta-case" if delta else "case", *map(str, failed[0])]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
        print("sanitizer:\n" + "\n".join((result.stdout + result.stderr).splitlines()[:40]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
