"""Step 1b (chunk-parallel linear Mamba-2) compiled on a GPU (``pytest -m gpu``): o and every gradient against the
package's chunkwise form in float64 on the GPU, up to T = 65,536; against step 1; bitwise the same twice."""

import pytest
import torch

pytestmark = pytest.mark.gpu

BOUND = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
CASES = [  # (B, T, H, Hk, K, V), dtype
    ((3, 333, 3, 1, 40, 24), torch.float32),
    ((3, 333, 3, 1, 40, 24), torch.bfloat16),
    ((2, 1000, 4, 4, 64, 64), torch.float16),
    ((2, 1000, 4, 4, 64, 64), torch.bfloat16),
    ((3, 333, 3, 3, 16, 16), torch.bfloat16),
    ((1, 4096, 8, 1, 128, 64), torch.bfloat16),
    ((1, 65536, 2, 1, 128, 64), torch.float16),
    ((1, 65536, 2, 1, 128, 64), torch.bfloat16),
]


def relative_errors(shape, dtype, fn, seed=0):
    """Relative errors of o, dq, dk, dv, d log_decay of ``fn`` in ``dtype`` against the chunkwise form in float64 on
    the same (rounded) inputs, dO random in ``dtype``: the inputs of :func:`~loglin_edu.bench.accuracy.accuracy`."""
    import loglin_edu as le
    from loglin_edu.bench.accuracy import accuracy_inputs, relative_error

    gen = torch.Generator().manual_seed(seed)
    q, k, v, _, g = accuracy_inputs(shape, gen)
    low = [x.cuda().to(dtype).requires_grad_(True) for x in (q, k, v, g)]
    high = [x.detach().double().requires_grad_(True) for x in low]
    out = fn(*low)
    weights = torch.randn(out.shape, generator=gen).to(device="cuda", dtype=dtype)
    grads = torch.autograd.grad((out.float() * weights.float()).sum(), low)
    ref = le.mamba2_attention(*high, form="chunkwise", chunk_size=64)
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), high)
    names = ("o", "dq", "dk", "dv", "dlog_decay")
    return dict(zip(names, [relative_error(out, ref)] + [relative_error(x, r) for x, r in zip(grads, ref_grads)]))


@pytest.mark.parametrize("shape, dtype", CASES, ids=[f"{s[1]}-{s[4]}x{s[5]}-Hk{s[3]}-{str(d)[6:]}" for s, d in CASES])
def test_step1b_errors_against_float64(shape, dtype):
    from loglin_edu.kernels.step1b_mamba2_parallel import mamba2_triton_parallel

    errors = relative_errors(shape, dtype, mamba2_triton_parallel)
    bad = {name: e for name, e in errors.items() if not e <= BOUND[dtype]}
    assert not bad, f"{dtype} {shape}: relative errors above {BOUND[dtype]}: {bad} (all: {errors})"


def test_step1b_agrees_with_step1_in_the_benchmark_setting():
    """48 heads, K = 128, V = 64, q/k shared, bf16, T = 1,024: o, dq, dk, dv of step 1b within 1e-2 of step 1's (the
    decay's gradient is checked against float64 above)."""
    from loglin_edu.bench.accuracy import relative_error
    from loglin_edu.bench.settings import GPU, make_inputs
    from loglin_edu.kernels.step1_mamba2_chunked import mamba2_triton
    from loglin_edu.kernels.step1b_mamba2_parallel import mamba2_triton_parallel

    x = make_inputs(2, 1024, GPU, "cuda")
    leaves = [x[n].requires_grad_(True) for n in ("q", "k", "v", "log_decay")]
    do = torch.randn(2, 1024, GPU.heads, GPU.value, device="cuda", dtype=torch.bfloat16)
    results = []
    for fn in (mamba2_triton, mamba2_triton_parallel):
        out = fn(*leaves)
        results.append([out, *torch.autograd.grad(out, leaves, do)])
    for name, got, want in zip(("o", "dq", "dk", "dv"), *results):
        assert relative_error(got, want) <= 1e-2, f"{name}: {relative_error(got, want):.2e} from step 1"


def test_step1b_is_deterministic():
    """Two calls give bitwise the same output and gradients (the heads' shares are summed in a fixed order)."""
    from loglin_edu.bench.settings import GPU, make_inputs
    from loglin_edu.kernels.step1b_mamba2_parallel import mamba2_triton_parallel

    x = make_inputs(1, 8192, GPU, "cuda")
    leaves = [x[n].requires_grad_(True) for n in ("q", "k", "v", "log_decay")]
    do = torch.randn(1, 8192, GPU.heads, GPU.value, device="cuda", dtype=torch.bfloat16)
    runs = []
    for _ in range(2):
        out = mamba2_triton_parallel(*leaves)
        runs.append([out, *torch.autograd.grad(out, leaves, do)])
    for first, second in zip(*runs):
        assert torch.equal(first, second)
