"""The log-linear Gated DeltaNet kernels compiled on a GPU (``pytest -m gpu``): fp32 (exact products, tf32x3 in the
per-chunk kernels), fp16 and bf16 against float64, up to T = 65,536. The float64 reference is the package's
chunkwise form, run on the GPU.

With ``LOGLIN_RECORD_ERRORS=path.json`` the measured errors are written there (book/results keeps them).
"""

import pytest
import torch

from kernel_helpers import apply_calls, assert_errors_within, case_id, write_recorded_errors

pytestmark = pytest.mark.gpu

CASES = [  # (B, T, H, Hk, K, V), dtype, DeltaLaunchConfig.precision (None: the default)
    ((2, 1000, 4, 4, 64, 64), torch.float32, None),
    ((2, 1000, 4, 4, 64, 64), torch.float16, None),
    ((2, 1000, 4, 4, 64, 64), torch.bfloat16, None),
    ((3, 333, 3, 1, 40, 24), torch.float32, None),
    ((3, 333, 3, 1, 40, 24), torch.bfloat16, None),
    ((3, 333, 3, 3, 16, 16), torch.bfloat16, None),
    ((1, 2048, 2, 2, 192, 384), torch.float32, None),  # the authors' widths: two key tiles, six value tiles
    ((1, 2048, 2, 2, 192, 384), torch.bfloat16, None),
    ((1, 4096, 2, 2, 256, 256), torch.bfloat16, None),
    ((1, 16384, 2, 2, 128, 64), torch.bfloat16, None),
    ((1, 65536, 2, 2, 128, 64), torch.float32, None),
    ((1, 65536, 2, 2, 128, 64), torch.float16, None),
    ((1, 65536, 2, 2, 128, 64), torch.bfloat16, None),
    ((1, 65536, 2, 2, 128, 64), torch.bfloat16, "exact"),
    ((1, 65536, 1, 1, 192, 384), torch.bfloat16, None),
]
BOUND = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
RECORDED = []
REFERENCE = "loglinear_attention(beta=..., form='chunkwise') in float64 on the GPU"


@pytest.mark.parametrize("shape, dtype, precision", CASES, ids=[case_id(c) for c in CASES])
def test_errors_against_float64(shape, dtype, precision):
    from loglin_edu.bench.accuracy import delta_accuracy
    from loglin_edu.kernels.config import DeltaLaunchConfig

    config = None if precision is None else DeltaLaunchConfig(precision=precision)
    result = delta_accuracy(shape, dtype, torch.device("cuda"), config=config)
    result["precision"] = precision or "default"
    RECORDED.append(result)
    write_recorded_errors(RECORDED, REFERENCE, BOUND)  # after every case: a run stopped midway keeps its cases
    assert_errors_within(result, BOUND[dtype], f"{dtype} {shape}")


def test_delta_rule_takes_the_kernel_on_request_only():
    import loglin_edu as le
    from loglin_edu.kernels import step9_loglinear_gated_deltanet as kernel

    x = torch.nn.functional.normalize(torch.randn(1, 100, 2, 16, device="cuda"), dim=-1)
    g, beta = -torch.rand(1, 100, 2, device="cuda"), torch.rand(1, 100, 2, device="cuda")
    lam = torch.rand(1, 100, 2, 8, device="cuda")
    function = kernel.LogLinearGatedDeltaNet
    assert not apply_calls(function, lambda: le.loglinear_attention(x, x, x, lam, g, beta)), \
        "form=None with beta took the Triton path"
    assert apply_calls(function, lambda: le.loglinear_attention(x, x, x, lam, g, beta, form="triton")), \
        "form='triton' with beta did not take the Triton path"


def test_layer_triton_backend_matches_torch_on_cuda():
    from loglin_edu.layers import LogLinearGatedDeltaNet

    torch.manual_seed(0)
    layer = LogLinearGatedDeltaNet(64, num_heads=4, max_len=512, backend="torch").cuda()
    x = torch.randn(2, 300, 64, device="cuda")
    results = {}
    for backend in ("torch", "triton"):
        layer.backend = backend
        layer.zero_grad()
        out = layer(x)
        (out * torch.linspace(-1, 1, out.numel(), device="cuda").view_as(out)).sum().backward()
        results[backend] = (out.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()})
    rel = lambda a, b: (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()  # noqa: E731
    assert rel(results["triton"][0], results["torch"][0]) < 1e-4
    for name, grad in results["torch"][1].items():
        assert rel(results["triton"][1][name], grad) < 1e-3, name


def test_profile_times_every_kernel_of_both_phases_with_its_registers():
    """The per-kernel profile at a small length of the benchmark's widths: every kernel of steps 6-8 timed in its
    phase, with the registers the driver reports for its binary."""
    from dataclasses import replace

    from loglin_edu.bench.profile import OURS, delta_kernel_work, profile_lengths
    from loglin_edu.bench.settings import GDN_GPU

    s = replace(GDN_GPU, tokens=2048)
    [profiled] = profile_lengths(s, [1024], OURS["gated_deltanet"], steps=1)
    phases = {r["kernel"]: r["phase"] for r in profiled["kernels"] if r["kernel"] in delta_kernel_work(2, 1024, s)}
    assert phases == {"delta_chunk_kernel": "forward", "level_walk_kernel": "forward",
                      "delta_output_kernel": "forward", "level_adjoint_walk_kernel": "backward",
                      "slot_gram_kernel": "backward", "level_gram_grads_kernel": "backward",
                      "level_read_grad_kernel": "backward", "delta_chunk_values_bwd_kernel": "backward",
                      "delta_chunk_solve_bwd_kernel": "backward", "delta_chunk_qk_bwd_kernel": "backward"}
    timed = [r for r in profiled["kernels"] if r["kernel"] in phases]
    assert all(r["ms"] > 0 and r["calls"] == 1 and 0 < r["n_regs"] <= 255 and r["n_spills"] >= 0 for r in timed), timed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_wy_solve_of_16_bit_inputs_is_far_finer_than_their_rounding(dtype):
    """16-bit inputs solve for ``T_β`` in bf16x3 products (:func:`~loglin_edu.kernels.tiles.dot_split`): the
    entries below the diagonal (the identity aside, all the solve computes) within 1e-3 of the float64 inverse of
    the same rounded inputs, under bf16's own rounding of 2^-8 ≈ 3.9e-3."""
    from loglin_edu.kernels.config import solve_precision
    from loglin_edu.kernels.step6_delta_chunks import delta_chunks

    assert solve_precision(dtype) == "bf16x3"
    B, T, H, K, V, C = 2, 512, 3, 192, 64, 64
    torch.manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).to(dtype)
    q, v = torch.randn(B, T, H, K, device="cuda", dtype=dtype), torch.randn(B, T, H, V, device="cuda", dtype=dtype)
    beta = torch.rand(B, T, H, device="cuda").to(dtype)
    g = (-0.1 * torch.rand(B, T, H, device="cuda")).to(dtype)
    out = delta_chunks(q, k, v, beta, g, chunk_size=C)
    gc = out.gc.double().view(B, H, -1, C)
    kc = k.double().permute(0, 2, 1, 3).reshape(B, H, -1, C, K)
    bc = out.beta.double().view(B, H, -1, C)
    decay = torch.tril((gc[..., :, None] - gc[..., None, :]).exp())
    eye = torch.eye(C, dtype=torch.float64, device="cuda")
    expected = torch.linalg.inv(eye + torch.tril(bc[..., :, None] * decay * (kc @ kc.mT), -1)) - eye
    error = torch.linalg.vector_norm(out.t_beta.double() - eye - expected) / torch.linalg.vector_norm(expected)
    assert error < 1e-3, f"T_β relative error below the diagonal {error:.2e}"


@pytest.mark.parametrize("shape", [(4, 1000, 2, 32, 64), (3, 333, 3, 40, 24), (2, 1024, 2, 64, 128)],
                         ids=["mqar-widths", "odd-widths", "wide-heads"])
@pytest.mark.parametrize("loglinear", [False, True], ids=["gated-deltanet", "loglinear"])
def test_gated_deltanet_triton_form_against_float64(shape, loglinear):
    """Gated DeltaNet's Triton form (the chunkwise form with step 10's WY factors), and the chunk scan on the same
    factors that log-linear Gated DeltaNet's Triton form runs inside ``torch.compile``, on fp32 inputs against the
    float64 PyTorch forms: products in tf32x3 within 1e-5 on o and every gradient, in TF32 (PyTorch's
    ``allow_tf32``) within 5e-3, the bound of the PyTorch forms' own TF32 products."""
    import loglin_edu as le
    from loglin_edu.fenwick import num_levels

    B, T, H, K, V = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    args = [torch.randn(B, T, H, K, device="cuda", generator=gen),
            torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1),
            torch.randn(B, T, H, V, device="cuda", generator=gen),
            -0.3 * torch.rand(B, T, H, device="cuda", generator=gen), torch.rand(B, T, H, device="cuda", generator=gen)]
    if loglinear:
        args.insert(3, 0.5 + torch.rand(B, T, H, num_levels(T), device="cuda", generator=gen))
    weights = torch.randn(B, T, H, V, device="cuda", generator=gen)
    def operator(q, k, v, *rest, form):
        if not loglinear:
            return le.gated_deltanet_attention(q, k, v, *rest, form=form)
        if form == "chunkwise":
            return le.loglinear_attention(q, k, v, *rest, form=form)
        lam, g, beta = (x.transpose(1, 2) for x in rest)
        heads = [x.transpose(1, 2) for x in (q, k, v)]
        return le.ops.loglinear_delta_rule_triton(*heads, lam, g, beta, 64, False).transpose(1, 2)

    def run(dtype, form):
        xs = [a.to(dtype).requires_grad_() for a in args]
        out = operator(*xs, form=form)
        return [out.detach(), *torch.autograd.grad((out * weights.to(dtype)).sum(), xs)]

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        reference = run(torch.float64, "chunkwise")
        for tf32, bound in ((False, 1e-5), (True, 5e-3)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            names = ("o", "dq", "dk", "dv", *(("dlevel_scales",) if loglinear else ()), "dlog_decay", "dbeta")
            for name, x, ref in zip(names, run(torch.float32, "triton"), reference):
                error = (torch.linalg.vector_norm(x.double() - ref) / torch.linalg.vector_norm(ref)).item()
                assert error < bound, f"tf32={tf32} {name}: relative error {error:.2e}"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
