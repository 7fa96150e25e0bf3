"""The Triton kernels compiled on a GPU (``pytest -m gpu``): fp32 (exact dots), fp16 and bf16 against
float64, up to T = 65,536. The float64 reference is the package's chunkwise form, run on the GPU.

With ``LOGLIN_RECORD_ERRORS=path.json`` the measured errors are written there (book/results keeps them).
"""

import pytest
import torch

from kernel_helpers import apply_calls, assert_errors_within, case_id, write_recorded_errors

pytestmark = pytest.mark.gpu

CASES = [  # (B, T, H, Hk, K, V), dtype, LaunchConfig.precision (None: the default)
    ((2, 1000, 4, 4, 64, 64), torch.float32, None),
    ((2, 1000, 4, 4, 64, 64), torch.float16, None),
    ((2, 1000, 4, 4, 64, 64), torch.bfloat16, None),
    ((3, 333, 3, 1, 40, 24), torch.float32, None),
    ((3, 333, 3, 1, 40, 24), torch.bfloat16, None),
    ((3, 333, 3, 1, 40, 24), torch.float16, None),
    ((3, 333, 3, 1, 16, 16), torch.bfloat16, None),
    ((3, 333, 3, 1, 16, 16), torch.float32, None),
    ((60, 256, 8, 1, 16, 16), torch.float32, None),
    ((3, 333, 3, 3, 32, 32), torch.bfloat16, None),
    ((1, 4096, 8, 1, 128, 64), torch.bfloat16, None),
    ((1, 65536, 2, 1, 128, 64), torch.float32, None),
    ((1, 20000, 2, 2, 64, 64), torch.bfloat16, None),
    ((1, 65536, 2, 1, 128, 64), torch.float16, None),
    ((1, 65536, 2, 1, 128, 64), torch.bfloat16, None),
    ((1, 65536, 2, 1, 128, 64), torch.bfloat16, "exact"),
]
BOUND = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
RECORDED = []
REFERENCE = "loglinear_attention(form='chunkwise') in float64 on the GPU"


@pytest.mark.parametrize("shape, dtype, config", CASES, ids=[case_id(c) for c in CASES])
def test_errors_against_float64(shape, dtype, config):
    from loglin_edu.bench.accuracy import accuracy
    from loglin_edu.kernels.config import LaunchConfig

    launch = None if config is None else LaunchConfig(precision=config)
    result = accuracy(shape, dtype, torch.device("cuda"), config=launch)
    result["config"] = config or "default"
    RECORDED.append(result)
    write_recorded_errors(RECORDED, REFERENCE, BOUND)  # after every case: a run stopped midway keeps its cases
    assert_errors_within(result, BOUND[dtype], f"{dtype} {shape}")


@pytest.mark.parametrize("K, V", [(40, 24), (16, 16), (32, 32), (128, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ladder_kernels_in_16_bit(K, V, dtype):
    """Steps 1 and 2 of the ladder in fp16/bf16 against their own fp32 run. Narrow head tiles (16, 32) once
    give NaN or 40 % errors in 16-bit with Triton 3.6 on Hopper: ``head_block`` keeps them >= 64."""
    from loglin_edu.fenwick import num_levels
    from loglin_edu.kernels.step2_intra_chunk import intra_chunk
    from loglin_edu.kernels.step1_mamba2_chunked import mamba2_triton

    B, T, H = 3, 333, 3
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, 1, K, generator=gen) * K**-0.5 for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    lam = 0.5 + torch.rand(B, T, H, num_levels(T) + 1, generator=gen)
    g = -0.1 * torch.rand(B, T, H, generator=gen)
    for name, fn in (("intra_chunk", lambda *x: intra_chunk(*x)), ("mamba2_triton", lambda q, k, v, lam, g: mamba2_triton(q, k, v, g))):
        ref = fn(*(x.cuda() for x in (q, k, v, lam, g))).double()
        out = fn(*(x.cuda().to(dtype) for x in (q, k, v, lam, g)))
        error = ((out.double() - ref).norm() / ref.norm()).item()
        assert error <= BOUND[dtype], f"{name} {dtype} K={K} V={V}: relative error {error:.1e} against its fp32 run"


@pytest.mark.parametrize("K, V", [(16, 16), (40, 24), (32, 64)])
@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_kernels_on_narrow_tiles(K, V, tf32):
    """fp32 calls keep head tiles as narrow as 16 on the GPU (16-bit calls take 64): steps 1 (Mamba-2) and 5
    (log-linear Mamba-2), output and every gradient against float64, exact products (bound 1e-5) or, while
    ``allow_tf32`` is set, tf32 products (bound 5e-3: tf32 keeps 10 bits of the mantissa)."""
    from loglin_edu.fenwick import num_levels
    from loglin_edu.kernels.config import head_block
    from loglin_edu.kernels.step1_mamba2_chunked import mamba2_triton
    from loglin_edu.kernels.step5_loglinear_mamba2 import loglinear_mamba2
    from loglin_edu.ops import mix

    assert head_block(16, torch.float32) == 16 and head_block(16, torch.bfloat16) == 64
    B, T, H = 12, 256, 4
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(B, T, 1, K, generator=gen) * K**-0.5 for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    lam = 0.5 + torch.rand(B, T, H, num_levels(T), generator=gen)
    g = -0.2 * torch.rand(B, T, H, generator=gen)
    args = [x.cuda() for x in (q, k, v, lam, g)]
    do = torch.randn(B, T, H, V, generator=gen).cuda()
    cases = {"mamba2": (lambda q, k, v, lam, g: mamba2_triton(q, k, v, g), lambda q, k, v, lam, g: mix(q, k, v, g)),
             "loglinear_mamba2": (lambda q, k, v, lam, g: loglinear_mamba2(q, k, v, lam, g),
                                  lambda q, k, v, lam, g: mix(q, k, v, g, None, lam))}
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, (kernel, form) in cases.items():
            torch.backends.cuda.matmul.allow_tf32 = False
            exact = [x.double().requires_grad_() for x in args]
            ref = form(*exact)
            ref_grads = torch.autograd.grad(ref, exact, do.double(), allow_unused=True)
            torch.backends.cuda.matmul.allow_tf32 = tf32
            ours = [x.clone().requires_grad_() for x in args]
            out = kernel(*ours)
            grads = torch.autograd.grad(out, ours, do, allow_unused=True)
            for what, a, b in [("o", out, ref), *zip(("dq", "dk", "dv", "dλ", "dg"), grads, ref_grads)]:
                if name == "mamba2" and what == "dλ":
                    continue
                error = ((a.double() - b).norm() / b.norm()).item()
                assert error <= (5e-3 if tf32 else 1e-5), f"{name} K={K} V={V} tf32={tf32} {what}: {error:.1e}"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_default_form_on_cuda_is_triton():
    import loglin_edu as le
    from loglin_edu.kernels import step5_loglinear_mamba2 as kernel

    x = torch.randn(1, 100, 2, 16, device="cuda")
    calls = apply_calls(kernel, attribute="loglinear_mamba2_forward", run=lambda: le.loglinear_attention(
        x, x, x, torch.rand(1, 100, 2, 8, device="cuda"), -torch.rand(1, 100, 2, device="cuda")))
    assert calls, "form=None on CUDA tensors did not take the Triton path"


VARIANTS = {  # launch variants of LaunchConfig, each the default's function
    "tree-key-split": dict(tree_key_split=2, tree_warps=8, upper_row_split=8),
    "register-tree": dict(tree_registers=True, tree_key_split=2, upper_row_split=8),
    "register-tree-8-warps": dict(tree_registers=True, tree_key_split=2, tree_warps=8, tree_max_registers=128),
    "sums-in-kernels": dict(grad_sums_in_kernels=True),
    "one-head-group": dict(grad_head_group=64, grad_sums_in_kernels=True),
    "backward-8-warps": dict(grad_warps=8, node_grad_warps=8, grad_stages=2),
    "fused-grads": dict(fused_grads=True),
    "fused-grads-sums-in-kernels": dict(fused_grads=True, grad_sums_in_kernels=True, grad_head_group=2),
    "node-grads-in-blocks": dict(node_grads_in_blocks=True),
    "node-grads-in-blocks-sums-in-kernels": dict(node_grads_in_blocks=True, grad_sums_in_kernels=True,
                                                 grad_head_group=2),
}
VARIANT_CASES = [
    ((3, 333, 3, 1, 40, 24), torch.bfloat16),
    ((1, 4096, 8, 1, 128, 64), torch.bfloat16),
    ((1, 65536, 2, 1, 128, 64), torch.bfloat16),
    ((2, 1000, 4, 4, 64, 64), torch.float32),
    ((1, 20000, 2, 2, 64, 64), torch.bfloat16),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape, dtype", VARIANT_CASES, ids=[case_id((s, d, None)) for s, d in VARIANT_CASES])
def test_launch_variants_against_float64(shape, dtype, variant):
    """Each launch variant meets the bound of its dtype against float64, as the default does."""
    from loglin_edu.bench.accuracy import accuracy
    from loglin_edu.kernels.config import LaunchConfig

    result = accuracy(shape, dtype, torch.device("cuda"), config=LaunchConfig(**VARIANTS[variant]))
    assert_errors_within(result, BOUND[dtype], f"{variant} {dtype} {shape}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_launch_variants_compute_the_default_function_in_fp32(variant):
    """fp32 (exact products): o and every gradient of a variant equal the default's to fp32 round-off.

    d log_decay is a reverse sum over 5,000 tokens of terms that cancel, so another order of its additions (more
    warps) moves it by more than one rounding: its bound is 4e-6 where the others' is 1e-6."""
    from loglin_edu.bench.accuracy import accuracy_inputs, relative_error
    from loglin_edu.kernels.config import LaunchConfig
    from loglin_edu.kernels.step5_loglinear_mamba2 import loglinear_mamba2

    args = [x.cuda() for x in accuracy_inputs((1, 5000, 4, 1, 128, 64), torch.Generator().manual_seed(0))]
    weights = torch.randn(1, 5000, 4, 64, generator=torch.Generator().manual_seed(1)).cuda()

    def run(config):
        leaves = [x.clone().requires_grad_(True) for x in args]
        out = loglinear_mamba2(*leaves, config=config)
        return [out.detach(), *torch.autograd.grad((out * weights).sum(), leaves)]

    for name, a, b in zip(("o", "dq", "dk", "dv", "dlevel_scales", "dlog_decay"), run(LaunchConfig(**VARIANTS[variant])),
                          run(LaunchConfig())):
        bound = 4e-6 if name == "dlog_decay" else 1e-6
        assert relative_error(a, b) <= bound, f"{variant}: {name} {relative_error(a, b):.1e}"
