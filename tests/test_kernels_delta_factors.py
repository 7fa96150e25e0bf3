"""Step 10, the WY factors of the delta rule as one operator, on the CPU under Triton's interpreter.

Against :func:`loglin_edu.chunking.wy_factors` in float64 (the factors and every gradient), then Gated DeltaNet's
``form="triton"`` and the chunk scan on the operator (log-linear Gated DeltaNet's Triton form inside
``torch.compile``) against their PyTorch forms, inside vmap, ``torch.library.opcheck`` and one compiled graph.
"""

import pytest
import torch

import loglin_edu as le
from kernel_helpers import DEVICE, grads_of
from operators import assert_close

step10 = pytest.importorskip("loglin_edu.kernels.step10_delta_factors_op")

from loglin_edu.kernels import interpreted  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
if DEVICE == "cpu" and not interpreted():
    pytest.skip("TRITON_INTERPRET=1 must be set before triton is imported", allow_module_level=True)


def inputs(B, T, H, Hk, K, V, seed=0, dtype=torch.float64, decay=True):
    """q, unit k ``[B, T, Hk, K]``, v ``[B, T, H, V]``, log decay in (-0.5, 0] (or None), β in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    x = [0.5 * torch.randn(B, T, Hk, K, generator=gen),
         torch.nn.functional.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1),
         torch.randn(B, T, H, V, generator=gen), -0.5 * torch.rand(B, T, H, generator=gen) if decay else None,
         torch.rand(B, T, H, generator=gen)]
    return [None if a is None else a.to(DEVICE, dtype) for a in x]


def chunked(q, k, v, log_decay, beta, C):
    """The factors' inputs, heads-first and cut into chunks: qc, kc, vc ``[B, H, N, C, D]``, β, g_cum ``[B, H, N, C]``."""
    from loglin_edu.chunking import split_chunks

    qc, kc, vc = (split_chunks(x.transpose(1, 2), C) for x in (q, k, v))
    return qc, kc, vc, split_chunks(beta.transpose(1, 2), C), split_chunks(log_decay.transpose(1, 2), C).cumsum(-1)


@pytest.mark.parametrize("B, T, H, K, V, C", [(2, 40, 2, 20, 24, 16), (2, 64, 2, 16, 16, 32), (1, 70, 3, 16, 80, 32),
                                             (1, 5, 1, 3, 2, 16)],
                         ids=["T40-off-the-grid", "T64-strided-views", "two-value-tiles", "T5-below-a-chunk"])
def test_factors_and_their_gradients_match_float64(B, T, H, K, V, C):
    q, k, v, g, beta = inputs(B, T, H, H, K, V)

    def factors(wy):
        return lambda *x: torch.cat([f.flatten() for f in wy(*chunked(*x, C))[:4]])

    out, grads = grads_of(factors(step10.wy_factors_triton), (q, k, v, g, beta))
    ref, ref_grads = grads_of(factors(le.chunking.wy_factors), (q, k, v, g, beta))
    assert_close(out, ref, what="intra, query, W, U₀")
    for name, a, b in zip(("dq", "dk", "dv", "dlog_decay", "dbeta"), grads, ref_grads):
        assert_close(a, b, what=name)


def test_gradients_of_one_factor_alone():
    """Outputs nobody uses reach the backward as None (zeros there): each factor alone has the reference's gradients
    (zero where the factor does not depend on an input, as intra and the query side on v)."""
    args = inputs(1, 40, 2, 2, 8, 12, seed=5)
    for index in range(4):
        grads = {}
        for name, wy in (("triton", step10.wy_factors_triton), ("torch", le.chunking.wy_factors)):
            xs = [a.clone().requires_grad_() for a in args]
            factor = wy(*chunked(*xs, 16))[index]
            weights = torch.randn(factor.shape, generator=torch.Generator().manual_seed(index)).to(factor)
            grads[name] = torch.autograd.grad((factor * weights).sum(), xs, allow_unused=True, materialize_grads=True)
        for name, a, b in zip(("dq", "dk", "dv", "dlog_decay", "dbeta"), grads["triton"], grads["torch"]):
            assert_close(a, b, what=f"factor {index}: {name}")


@pytest.mark.parametrize("B, T, H, Hk, decay, C", [(2, 50, 2, 2, True, 16), (1, 37, 3, 1, True, 8), (2, 20, 2, 2, False, 32),
                                                   (2, 64, 2, 2, True, 16)],
                         ids=["per-head", "shared-qk-chunk-8", "no-decay", "whole-chunks"])
def test_gated_deltanet_triton_form_is_the_chunkwise_form(B, T, H, Hk, decay, C):
    """Output, every gradient and the state after the last token (``return_state``), in float64 and float32."""
    args = inputs(B, T, H, Hk, 12, 10, seed=3, decay=decay)
    for dtype, rtol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        low = [None if a is None else a.to(dtype) for a in args]
        out, grads = grads_of(lambda *x: le.gated_deltanet_attention(*x, form="triton", chunk_size=C), low)
        ref, ref_grads = grads_of(lambda *x: le.gated_deltanet_attention(*x, form="chunkwise", chunk_size=C), low)
        assert out.dtype == dtype
        assert_close(out, ref, rtol=rtol, what=f"{dtype}: o")
        for a, b in zip(grads, ref_grads):
            assert_close(a, b, rtol=rtol, what=f"{dtype}: a gradient")
    _, state = le.ops.mix(*args, form="triton", chunk_size=C, return_state=True)
    _, ref_state = le.ops.mix(*args, form="chunkwise", chunk_size=C, return_state=True)
    assert_close(state, ref_state, what="state after T tokens")


@pytest.mark.parametrize("B, T, H, Hk, decay, C", [(2, 50, 2, 2, True, 16), (1, 37, 3, 1, True, 8),
                                                   (2, 20, 2, 2, False, 32), (1, 96, 2, 2, True, 16)],
                         ids=["per-head", "shared-qk-chunk-8", "no-decay", "three-chunk-levels"])
def test_loglinear_gated_deltanet_chunk_scan_on_the_operator_is_the_chunkwise_form(B, T, H, Hk, decay, C):
    """What log-linear Gated DeltaNet's Triton form runs inside ``torch.compile`` (:func:`~loglin_edu.ops.mix`): the
    chunk scan on the operator's factors. Output, every gradient (dλ too) and the Fenwick state after the last
    token, in float64 and float32."""
    q, k, v, g, beta = inputs(B, T, H, Hk, 12, 10, seed=4, decay=decay)
    lam = (0.5 + torch.rand(B, T, H, le.num_levels(T) + 1, generator=torch.Generator().manual_seed(2))).to(q)
    args = [q, k, v, lam, g, beta]
    for dtype, rtol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        low = [None if a is None else a.to(dtype) for a in args]
        out, grads = grads_of(scan_on_operator(C), low)
        ref, ref_grads = grads_of(lambda *x: le.loglinear_attention(*x, form="chunkwise", chunk_size=C), low)
        assert out.dtype == dtype
        assert_close(out, ref, rtol=rtol, what=f"{dtype}: o")
        for a, b in zip(grads, ref_grads):
            assert_close(a, b, rtol=rtol, what=f"{dtype}: a gradient")
    _, state = scan_on_operator(C, return_state=True)(*args)
    _, ref_state = le.loglinear_attention(*args, form="chunkwise", chunk_size=C, return_state=True)
    assert state.position == ref_state.position == T
    for level, (a, b) in enumerate(zip(state.levels, ref_state.levels, strict=True)):
        assert (a is None) == (b is None), f"level {level}"
        if a is not None:
            assert_close(a.double(), b, rtol=1e-5, what=f"state level {level}")


def scan_on_operator(chunk_size, return_state=False):
    """:func:`~loglin_edu.ops.loglinear_delta_rule_triton` on ``[B, T, H, D]`` tensors (q, k, v, λ, log decay, β)."""
    from loglin_edu.layout import heads_first, time_first

    def run(q, k, v, lam, g, beta):
        H = v.shape[2]
        result = le.ops.loglinear_delta_rule_triton(
            heads_first(q, H), heads_first(k, H), heads_first(v, H), lam.transpose(1, 2),
            None if g is None else g.transpose(1, 2), beta.transpose(1, 2), chunk_size, return_state)
        return (time_first(result[0]), result[1]) if return_state else time_first(result)

    return run


def test_the_triton_form_of_log_linear_gated_deltanet_is_the_chunk_scan_only_when_compiled(monkeypatch):
    """Eager calls take the whole-operator kernels (step 9); a call that ``torch.compile`` traces, the chunk scan."""
    calls = []
    original = le.ops.loglinear_delta_rule_triton
    monkeypatch.setattr(le.ops, "loglinear_delta_rule_triton", lambda *a: calls.append(1) or original(*a))
    q, k, v, g, beta = (x.float() for x in inputs(1, 20, 2, 2, 8, 8, seed=6))
    lam = torch.ones(1, 20, 2, le.num_levels(20), device=q.device)
    eager = le.ops.mix(q, k, v, g, beta, lam, form="triton", chunk_size=16)
    assert not calls
    compiled = torch.compile(lambda *a: le.ops.mix(*a, form="triton", chunk_size=16), backend="eager")
    assert_close(compiled(q, k, v, g, beta, lam), eager, rtol=1e-5, what="compiled")
    assert calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_give_16_bit_outputs_near_float64(dtype):
    """The factors are computed in fp32 and rounded once to the inputs' type, in which the rest of the form runs."""
    args = inputs(1, 40, 2, 2, 8, 8, seed=7)
    out = le.gated_deltanet_attention(*(a.to(dtype) for a in args), form="triton", chunk_size=16)
    ref = le.gated_deltanet_attention(*(a.to(dtype).double() for a in args), form="chunkwise", chunk_size=16)
    assert out.dtype == dtype
    assert_close(out.double(), ref, rtol=3e-2, what=f"{dtype}: o")


@pytest.mark.parametrize("loglinear", [False, True], ids=["gated-deltanet", "loglinear"])
def test_the_operator_runs_inside_vmap(loglinear):
    """Its vmap rule folds the mapped dimension into the batch: the same outputs and gradients as one call per member."""
    q, k, v, g, beta = inputs(3, 40, 2, 2, 8, 8, seed=12)  # 3 members of batch 1
    members = [q, k, v, g, beta]
    if loglinear:
        lam = 0.5 + torch.rand(3, 40, 2, le.num_levels(40), generator=torch.Generator().manual_seed(3))
        members.append(lam.to(q))
    stacked = [x[:, None].requires_grad_() for x in members]
    if loglinear:  # the chunk scan on the operator, as a compiled call runs it
        call = lambda q, k, v, g, beta, lam: scan_on_operator(16)(q, k, v, lam, g, beta)  # noqa: E731
    else:
        call = lambda *a: le.ops.mix(*a, form="triton", chunk_size=16)  # noqa: E731
    mapped = torch.func.vmap(call)(*stacked)
    grads = torch.autograd.grad(mapped, stacked, torch.sin(mapped))
    for m in range(3):
        single = [x[m].detach().requires_grad_() for x in stacked]
        out = call(*single)
        assert_close(mapped[m], out, what=f"member {m}: o")
        for a, b in zip(grads, torch.autograd.grad(out, single, torch.sin(out))):
            assert_close(a[m], b, what=f"member {m}: a gradient")


def test_the_operator_passes_torch_opcheck():
    """Schema, shapes without data, the registered gradient and the vmap rule (``torch.library.opcheck``)."""
    q, k, v, g, beta = (x.float() for x in inputs(2, 40, 2, 2, 8, 8, seed=13))
    qc, kc, vc, b, g_cum = (x.requires_grad_() for x in chunked(q, k, v, g, beta, 16))
    flat = [x.flatten(2, 3) for x in (qc, kc, vc)]
    torch.library.opcheck(step10.delta_factors, (*flat, b, g_cum, step10.factor_precision(torch.float32)))


@pytest.mark.parametrize("name", ["gated_deltanet", "loglinear_gated_deltanet"])
def test_a_compiled_ensemble_on_the_kernels_is_one_graph(name):
    from loglin_edu.layers import ModelConfig, build_model
    from loglin_edu.train.ensemble import Ensemble

    config = ModelConfig(name, vocab_size=32, d_model=16, max_len=64,
                         mixer_options=dict(backend="triton", chunk_size=16))
    ensemble = Ensemble([build_model(config).to(DEVICE) for _ in range(2)])
    tokens = torch.randint(0, 32, (2, 3, 64), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    explained = torch._dynamo.explain(lambda t: ensemble(t).square().mean())(tokens)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_chunk_sizes_and_widths_the_kernels_do_not_take_are_refused():
    qc = torch.zeros(1, 1, 2, 24, 8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="chunk sizes that are powers of two >= 16"):
        step10.wy_factors_triton(qc, qc, qc, qc[..., 0], qc[..., 0])


def test_the_decoding_state_of_a_log_linear_scan_needs_the_write_keys():
    """Factors without ``T_β`` give chunk terms without write keys: the log-linear prefill says so rather than guess."""
    q, k, v, g, beta = (x.transpose(1, 2) for x in inputs(1, 20, 1, 1, 4, 4))
    lam = torch.ones(1, 1, 20, le.num_levels(20), dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="write keys"):
        le.chunk_scan.chunk_scan(q, k, v, lam, g, beta, 16, return_state=True, factors=step10.wy_factors_triton)


def test_the_gated_deltanet_layer_on_its_kernel_is_the_layer_on_pytorch():
    from loglin_edu.layers import GatedDeltaNet

    torch.manual_seed(0)
    layer = GatedDeltaNet(32, num_heads=2, backend="torch", chunk_size=16).to(DEVICE, torch.float64)
    x = torch.randn(2, 40, 32, dtype=torch.float64).to(DEVICE)
    results = {}
    for backend in ("torch", "triton"):
        layer.backend = backend
        layer.zero_grad()
        out = layer(x)
        (out * torch.linspace(-1, 1, out.numel()).to(out).view_as(out)).sum().backward()
        results[backend] = (out.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()})
    assert_close(results["triton"][0], results["torch"][0], what="output")
    for name, grad in results["torch"][1].items():
        assert_close(results["triton"][1][name], grad, what=name)
