"""The Triton kernels compiled on a GPU (``pytest -m gpu``): fp32 (exact dots), fp16 and bf16 against
float64, up to T = 65,536. The float64 reference is the package's chunkwise form, run on the GPU.

With ``LOGLIN_RECORD_ERRORS=path.json`` the measured errors are written there (book/results keeps them).
"""

import json
import os

import pytest
import torch

pytestmark = pytest.mark.gpu

CASES = [  # (B, T, H, Hk, K, V), dtype
    ((2, 1000, 4, 4, 64, 64), torch.float32),
    ((2, 1000, 4, 4, 64, 64), torch.float16),
    ((2, 1000, 4, 4, 64, 64), torch.bfloat16),
    ((3, 333, 3, 1, 40, 24), torch.float32),
    ((3, 333, 3, 1, 40, 24), torch.bfloat16),
    ((1, 4096, 8, 1, 128, 64), torch.bfloat16),
    ((1, 65536, 2, 1, 128, 64), torch.float32),
    ((1, 65536, 2, 1, 128, 64), torch.bfloat16),
]
BOUND = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
RECORDED = []


@pytest.fixture(scope="module", autouse=True)
def record():
    yield
    path = os.environ.get("LOGLIN_RECORD_ERRORS")
    if path and RECORDED:
        from loglin_edu.bench import versions

        with open(path, "w") as f:
            json.dump({"versions": versions(), "reference": "loglinear_attention(form='chunkwise') in float64 on the GPU",
                       "bounds": {str(k).replace("torch.", ""): v for k, v in BOUND.items()}, "cases": RECORDED}, f, indent=1)


@pytest.mark.parametrize("shape, dtype", CASES, ids=[f"{s[1]}-{'shared' if s[3] == 1 else 'heads'}-{str(d)[6:]}" for s, d in CASES])
def test_errors_against_float64(shape, dtype):
    from loglin_edu.bench import accuracy

    result = accuracy(shape, dtype, torch.device("cuda"))
    RECORDED.append(result)
    bad = {name: e for name, e in result["errors"].items() if not e <= BOUND[dtype]}
    assert not bad, f"{dtype} {shape}: relative errors above {BOUND[dtype]}: {bad}"


def test_default_form_on_cuda_is_triton():
    import loglin_edu as le
    from loglin_edu.kernels import loglinear_mamba2 as kernel

    calls = []
    original = kernel.LogLinearMamba2.apply
    kernel.LogLinearMamba2.apply = lambda *a: calls.append(1) or original(*a)
    try:
        x = torch.randn(1, 100, 2, 16, device="cuda")
        le.loglinear_attention(x, x, x, torch.rand(1, 100, 2, 8, device="cuda"), -torch.rand(1, 100, 2, device="cuda"))
    finally:
        kernel.LogLinearMamba2.apply = original
    assert calls, "form=None on CUDA tensors did not take the Triton path"
