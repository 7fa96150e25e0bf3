"""Every form of every operator computes the same function, forward and backward, in float64."""

import math

import pytest
import torch

from hypothesis import given
from hypothesis import strategies as st

import loglin_edu as le

from operators import LOGLINEAR, OPERATORS, assert_close, outputs_and_grads
from reference import loglinear_reference, softmax_reference

IDS = [op.name for op in OPERATORS]


def reference(op, args):
    if op.name == "softmax":
        q = args[0]
        return softmax_reference(*args, scale=1 / math.sqrt(q.shape[-1]))
    q, k, v, *rest = args
    lam = rest.pop(0) if op.level_scales else None
    log_decay = rest.pop(0) if rest else None
    beta = rest.pop(0) if rest else None
    return loglinear_reference(q, k, v, lam, log_decay, beta)


@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
@pytest.mark.parametrize("T", [1, 2, 5, 9, 17])
@pytest.mark.parametrize("shared_qk", [False, True])
def test_naive_form_matches_the_definition(op, T, shared_qk):
    args = op.inputs(B=2, T=T, H=2, K=3, V=2, seed=T, shared_qk=shared_qk)
    assert_close(op(*args, form="naive"), reference(op, args), what=f"{op.name} naive vs definition")


def check_all_forms(op, B, T, H, K, V, chunk_size, seed, shared_qk):
    if op.name == "softmax":  # its chunkwise form loops over (query block, key block) pairs: keep C >= 16
        chunk_size = max(chunk_size, 16)
    args = op.inputs(B, T, H, K, V, seed=seed, shared_qk=shared_qk)
    ref_out, ref_grads = outputs_and_grads(op, args, form="naive")
    for form in le.REFERENCE_FORMS:
        out, grads = outputs_and_grads(op, args, form=form, chunk_size=chunk_size)
        where = f"{op.name} form={form} T={T} C={chunk_size}"
        assert_close(out, ref_out, what=where)
        for i, (g, g_ref) in enumerate(zip(grads, ref_grads)):
            assert_close(g, g_ref, what=f"{where} grad of input {i}")


@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
@given(
    B=st.integers(1, 2),
    T=st.one_of(st.sampled_from([1, 2, 3, 7, 8, 9, 16, 31, 33]), st.integers(1, 300)),
    H=st.integers(1, 3),
    K=st.integers(1, 8),
    V=st.integers(1, 8),
    log2_chunk=st.integers(0, 6),
    seed=st.integers(0, 2**31 - 1),
    shared_qk=st.booleans(),
)
@pytest.mark.slow
def test_every_form_agrees_with_naive(op, B, T, H, K, V, log2_chunk, seed, shared_qk):
    check_all_forms(op, B, T, H, K, V, 2**log2_chunk, seed, shared_qk)


@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 127, 128, 129])
def test_lengths_around_the_chunk_size(op, T):
    check_all_forms(op, B=1, T=T, H=2, K=4, V=3, chunk_size=64, seed=T, shared_qk=False)


@pytest.mark.parametrize("op", LOGLINEAR, ids=[op.name for op in LOGLINEAR])
@pytest.mark.parametrize("chunk_size", [1, 4, 16])
def test_many_chunk_levels(op, chunk_size):
    """T = 300 with small chunks: up to 9 chunk levels in the inter-chunk stage."""
    check_all_forms(op, B=1, T=300, H=1, K=3, V=2, chunk_size=chunk_size, seed=chunk_size, shared_qk=True)


@pytest.mark.parametrize("op", LOGLINEAR, ids=[op.name for op in LOGLINEAR])
@pytest.mark.parametrize("form", ["naive", "recurrent", "chunkwise"])
def test_unit_level_scales_recover_the_linear_model(op, form):
    """λ ≡ 1 makes M^H the causal mask: the log-linear operator becomes its linear model exactly."""
    import loglin_edu as le

    q, k, v, lam, *gates = op.inputs(B=2, T=70, H=2, K=4, V=3, seed=3, ones=True)
    out = op(q, k, v, lam, *gates, form=form, chunk_size=16)
    if op.delta:
        linear = le.gated_deltanet_attention(q, k, v, *gates, form=form, chunk_size=16)
    else:
        linear = le.mamba2_attention(q, k, v, *(gates or [None]), form=form, chunk_size=16)
    assert_close(out, linear, rtol=1e-12, what=f"{op.name} λ≡1 vs linear model, form={form}")


def test_float32_forms_agree_to_float32_precision():
    import loglin_edu as le

    op = LOGLINEAR[-1]
    args = op.inputs(B=1, T=100, H=2, K=8, V=8, seed=0, dtype=torch.float32)
    ref = op(*[None if a is None else a.double() for a in args], form="naive")
    for form in le.REFERENCE_FORMS:
        out = op(*args, form=form, chunk_size=16)
        assert out.dtype == torch.float32
        assert_close(out.double(), ref, rtol=1e-5, what=f"float32 {form}")


@pytest.mark.parametrize("chunk_size", [1, 2, 8, 32])
def test_intra_chunk_scales_are_the_gathered_level_weights(chunk_size):
    """``Λ[n, i, j] = λ[nC + i, level(i, j)]`` below the diagonal and 0 above, exactly; its gradient sends each
    entry's gradient to its level, as a gather's does (to rounding: the sums run in another order)."""
    from loglin_edu.chunk_scan import intra_chunk_scales
    from loglin_edu.fenwick import levels_within_chunk

    torch.manual_seed(0)
    lam = torch.rand(2, 3, 4, chunk_size, chunk_size.bit_length() + 2, dtype=torch.float64, requires_grad=True)
    levels = levels_within_chunk(chunk_size)
    gathered = torch.gather(lam, -1, levels.clamp(min=0).expand(*lam.shape[:-1], chunk_size)) * (levels >= 0)
    scales = intra_chunk_scales(lam, chunk_size)
    assert torch.equal(scales, gathered)
    weights = torch.randn_like(scales)
    (expected,) = torch.autograd.grad(gathered, lam, weights)
    (grad,) = torch.autograd.grad(scales, lam, weights)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
