"""The log-linear Gated DeltaNet kernels (steps 6-9) on the CPU, under Triton's interpreter.

Each step against the one before and against the package's float64 forms, fp32 with exact (ieee) dots;
then ``loglinear_attention(..., beta=..., form="triton")`` forward and every gradient (q, k, v, λ,
log_decay, β); guard bands around every input and output; vmap; the layer's Triton backend. Chunks of
16 tokens and key/value tiles of 16 columns make several chunk levels, two key tiles and several value
tiles out of small shapes (the interpreter is slow).
"""

import pytest
import torch

import loglin_edu as le
from kernel_helpers import DEVICE, grads_of, guard_intact, padded_copy, padded_view, zero_fill_sizes
from operators import assert_close

kernels = pytest.importorskip("loglin_edu.kernels.step9_loglinear_gated_deltanet")

from loglin_edu.kernels import interpreted  # noqa: E402
from loglin_edu.kernels.config import DeltaLaunchConfig  # noqa: E402
from loglin_edu.kernels.step6_delta_chunks import delta_chunks  # noqa: E402
from loglin_edu.kernels.step7_delta_levels import (  # noqa: E402
    first_slots, level_states, loglinear_delta_forward, read_slot_count)
from loglin_edu.kernels.step8_delta_backward import loglinear_delta_backward  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
if DEVICE == "cpu" and not interpreted():
    pytest.skip("TRITON_INTERPRET=1 must be set before triton is imported", allow_module_level=True)

SMALL_TILES = DeltaLaunchConfig(key_tile=16, value_tile=16)  # K > 16: two key tiles; V > 16: several value tiles


def inputs(B, T, H, Hk, K, V, seed=0, dtype=torch.float64, decay=True):
    """q, unit k ``[B, T, Hk, K]``, v, λ (one level more than needed), log decay in (-0.5, 0], β in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    x = [torch.randn(B, T, Hk, K, generator=gen),
         torch.nn.functional.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1),
         torch.randn(B, T, H, V, generator=gen), 0.5 + torch.rand(B, T, H, le.num_levels(T) + 1, generator=gen),
         -0.5 * torch.rand(B, T, H, generator=gen) if decay else None, torch.rand(B, T, H, generator=gen)]
    return [None if a is None else a.to(DEVICE, dtype) for a in x]


NAMES = ("dq", "dk", "dv", "dlevel_scales", "dlog_decay", "dbeta")


def check_against_float64(fn, reference, args, rtol, what, dtype=torch.float32):
    """The kernels in ``dtype`` against the float64 form on the same (rounded) inputs: o and every gradient."""
    low = [None if a is None else a.to(dtype) for a in args]
    out, grads = grads_of(fn, low)
    ref, ref_grads = grads_of(reference, [None if a is None else a.double() for a in low])
    assert out.dtype == dtype
    assert_close(out.double(), ref, rtol=rtol, atol=1e-6, what=f"{what}: o")
    names = NAMES if len(args) == 6 else NAMES[:4] + NAMES[5:]  # without log_decay: (q, k, v, λ, β)
    for name, g, r in zip(names, grads, ref_grads):
        assert_close(g.double(), r, rtol=rtol, atol=1e-6, what=f"{what}: {name}")
    return grads


# --- step 6: the WY factors of every chunk --------------------------------------------------------------


def test_step6_factors_match_the_chunk_terms():
    """query and the intra-chunk block P as :func:`~loglin_edu.chunking.chunk_terms` has them; the chunk's
    write ``K̃ᵀ U₀`` and transition ``γ_C I - K̃ᵀ W`` rebuilt from the kernel's W, U₀. K = 20 is two key tiles."""
    from loglin_edu.chunking import chunk_terms, split_chunks
    from loglin_edu.layout import heads_first

    B, T, H, K, V, C = 2, 50, 2, 20, 7, 16
    q, k, v, _, g, beta = inputs(B, T, H, 1, K, V)
    out = delta_chunks(*(x.float() for x in (q, k, v, beta, g)), chunk_size=C, config=SMALL_TILES)
    qh, kh, vh = (heads_first(x, H) for x in (q, k, v))
    terms = chunk_terms(qh, kh, vh, g.transpose(1, 2), beta.transpose(1, 2), C)
    N = -(-T // C)
    w, query = (x.view(B, H, N, C, -1)[..., :K].double() for x in (out.w, out.query))
    u = out.u.view(B, H, N, C, -1)[..., :V].double()
    gc = out.gc.view(B, H, N, C).double()
    k_to_end = (gc[..., -1:] - gc).exp()[..., None] * split_chunks(kh, C)
    transition = gc[..., -1].exp()[..., None, None] * torch.eye(K, dtype=torch.float64) - k_to_end.mT @ w
    assert_close(query, terms.query, rtol=1e-6, what="query")
    assert_close(out.intra.double(), terms.intra, rtol=1e-6, what="P")
    assert_close(k_to_end.mT @ u, terms.own, rtol=1e-6, what="own = K̃ᵀ U₀")
    assert_close(transition, terms.transition, rtol=1e-6, what="transition")


def test_step6_triangular_solve_is_exact_for_correlated_keys():
    """Equal keys and β = 1 (the worst case of the delta rule: ``A_β`` all ones below the diagonal) at C = 64: the
    block forward substitution stays exact where a Neumann series would sum terms of size binomial(63, 31)."""
    B, T, H, K, V, C = 1, 64, 1, 4, 4, 64
    k = torch.nn.functional.normalize(torch.ones(B, T, H, K, dtype=torch.float64), dim=-1)
    q, v = torch.randn(B, T, H, K, dtype=torch.float64), torch.randn(B, T, H, V, dtype=torch.float64)
    beta = torch.ones(B, T, H, dtype=torch.float64)
    out = delta_chunks(q, k, v, beta, None, chunk_size=C)
    i = torch.arange(C)
    expected = (i[:, None] == i[None, :]).double() - (i[:, None] == i[None, :] + 1).double()  # (I + strict ones)⁻¹
    assert_close(out.t_beta[0, 0, 0], expected, rtol=1e-14, what="T_β")


# --- step 7: the level walks and the output ------------------------------------------------------------


def test_step7_read_states_carry_each_bucket_through_the_chunk_transitions():
    """Every stored ``X_{c,ℓ}`` equals bucket ``ℓ`` of chunk ``c`` carried to the chunk's start through the
    transitions of :func:`~loglin_edu.chunking.chunk_terms`: ``Σ_{c' in bucket} Φ_{c-1} ··· Φ_{c'+1} own_{c'}``."""
    from loglin_edu.chunking import chunk_terms
    from loglin_edu.layout import heads_first

    B, T, H, K, V, C = 1, 100, 2, 20, 20, 16
    q, k, v, _, g, beta = inputs(B, T, H, 2, K, V, seed=4)
    chunks = delta_chunks(*(x.float() for x in (q, k, v, beta, g)), chunk_size=C, config=SMALL_TILES)
    states = level_states(k.float(), chunks, T, V, C, SMALL_TILES)
    terms = chunk_terms(*(heads_first(x, H) for x in (q, k, v)), g.transpose(1, 2), beta.transpose(1, 2), C)
    first = first_slots(-(-T // C), q.device)
    for c in range(-(-T // C)):
        slot = int(first[c])
        for level in range(1, c.bit_length() + 1):
            if not (c >> (level - 1)) & 1:
                continue
            start = (c >> level) << level
            carried = torch.zeros(B, H, K, V, dtype=torch.float64)
            for source in range(start, start + (1 << (level - 1))):
                carried = terms.propagate(source, carried) + terms.own[:, :, source]
            for between in range(start + (1 << (level - 1)), c):
                carried = terms.propagate(between, carried)
            assert_close(states[:, :, slot, :K, :V].double(), carried, rtol=1e-6, what=f"X[c={c}, level={level}]")
            slot += 1


SHAPES = [  # B, T, H, Hk, K, V, chunk size, launch config
    (2, 50, 2, 1, 8, 5, 16, DeltaLaunchConfig()),  # shared q/k, T off the chunk grid
    (1, 100, 2, 2, 20, 24, 16, SMALL_TILES),  # 3 chunk levels, two key tiles, two value tiles
    (1, 90, 2, 2, 16, 40, 16, SMALL_TILES),  # one key tile (BK2 = 0), three value tiles, 3 chunk levels
    (2, 10, 2, 2, 3, 3, 32, DeltaLaunchConfig()),  # T < chunk
    (2, 11, 1, 1, 20, 18, 16, SMALL_TILES),  # T < chunk, shared q/k, two key tiles
    (1, 1, 1, 1, 2, 2, 16, DeltaLaunchConfig()),  # one token
    (1, 40, 2, 2, 100, 8, 16, DeltaLaunchConfig()),  # one key tile of 128 > the WY backward's key sub-tiles
    (1, 40, 1, 1, 40, 8, 16, DeltaLaunchConfig(key_tile=32)),  # key tiles 32 + 16, as 128 + 64 at K = 192
]
IDS = [f"T{s[1]}-H{s[2]}-Hk{s[3]}-K{s[4]}-V{s[5]}-C{s[6]}" for s in SHAPES]


@pytest.mark.parametrize("B, T, H, Hk, K, V, C, config", SHAPES, ids=IDS)
def test_step7_forward_matches_chunkwise(B, T, H, Hk, K, V, C, config):
    q, k, v, lam, g, beta = inputs(B, T, H, Hk, K, V, seed=T)
    out, _, _ = loglinear_delta_forward(*(x.float() for x in (q, k, v, lam, beta, g)), chunk_size=C, config=config)
    ref = le.loglinear_attention(q, k, v, lam, g, beta, form="chunkwise")
    assert_close(out.double(), ref, rtol=2e-6, what=f"forward T={T}")


# --- steps 8-9: the backward and the autograd Function --------------------------------------------------


@pytest.mark.parametrize("B, T, H, Hk, K, V, C, config", SHAPES, ids=IDS)
def test_forward_and_every_gradient_match_float64(B, T, H, Hk, K, V, C, config):
    check_against_float64(
        lambda q, k, v, lam, g, beta: kernels.loglinear_gated_deltanet(q, k, v, lam, g, beta, chunk_size=C, config=config),
        lambda q, k, v, lam, g, beta: le.loglinear_attention(q, k, v, lam, g, beta, form="naive" if T <= 64 else "chunkwise"),
        inputs(B, T, H, Hk, K, V, seed=T + 1), rtol=2e-6, what=f"T={T}",
    )


SCHEDULES = {"levels-gram": dict(backward_walk="levels"), "levels": dict(backward_walk="levels", gram_grads=False),
             "stacked-narrow": dict(value_tile=32, adjoint_value_tile=16),
             "forward-stacked": dict(forward_walk="stacked")}


@pytest.mark.parametrize("K, V", [(24, 40), (16, 32)], ids=["two-key-tiles", "one-key-tile"])
def test_the_schedules_agree_to_round_off(K, V):
    """The default schedule (forward: the walks per level and block; backward: one reverse walk carrying every live
    level, the chunk factors' gradients through one ``K × K`` product per chunk) against the walks per level
    backwards too, with the Gram product or level by level, the reverse walk on value tiles narrower than the rest
    of the kernels', and one forward walk carrying every live level: in float64 the same output and gradients to
    round-off (10 chunks: four levels, left and right halves, a last block cut short)."""
    args = inputs(1, 150, 2, 2, K, V, seed=K)

    def run(knobs):
        config = DeltaLaunchConfig(**{"key_tile": 16, "value_tile": 16, **knobs})
        return grads_of(lambda *a: kernels.loglinear_gated_deltanet(*a, chunk_size=16, config=config), args)

    out, grads = run({})
    for schedule, knobs in SCHEDULES.items():
        ref, ref_grads = run(knobs)
        assert_close(out, ref, rtol=1e-13, what=f"{schedule}: o")
        for name, g, r in zip(NAMES, grads, ref_grads):
            assert_close(g, r, rtol=1e-13, atol=1e-15, what=f"{schedule}: {name}")


@pytest.mark.parametrize("schedule", ["default", "levels"])
def test_16_bit_factors_are_the_fp32_factors_rounded_once(schedule, monkeypatch):
    """``factor_dtype="float16"`` stores W and the queries in fp16 and changes nothing else: the output and every
    gradient equal, bit for bit, those of the fp32 factors rounded to fp16 where step 6 leaves them, under the
    default schedule and the walks per level (between them every kernel that loads a factor). (bf16 the same way
    on a GPU: Triton's interpreter rounds fp32 to bf16 otherwise than the GPU and torch do.)"""
    from loglin_edu.kernels import step7_delta_levels

    args = [x.float() for x in inputs(1, 150, 2, 2, 24, 40, seed=11)]
    knobs = {"key_tile": 16, "value_tile": 16, **SCHEDULES.get(schedule, {})}
    run = lambda config: grads_of(  # noqa: E731
        lambda *a: kernels.loglinear_gated_deltanet(*a, chunk_size=16, config=config), args)
    out, grads = run(DeltaLaunchConfig(**knobs, factor_dtype="float16"))
    fp32_factors = step7_delta_levels.delta_chunks

    def rounded_factors(*a, **kw):
        chunks = fp32_factors(*a, **kw)
        assert chunks.w.dtype == chunks.query.dtype == torch.float32
        for factor in (chunks.w, chunks.query):
            factor.copy_(factor.to(torch.float16))
        return chunks

    monkeypatch.setattr(step7_delta_levels, "delta_chunks", rounded_factors)
    ref, ref_grads = run(DeltaLaunchConfig(**knobs))
    assert torch.equal(out, ref), schedule
    for name, g, r in zip(NAMES, grads, ref_grads):
        assert torch.equal(g, r), f"{schedule}: {name}"


@pytest.mark.parametrize("factor_dtype, rtol", [("float16", 2e-4), ("bfloat16", 2e-3)])
def test_16_bit_factors_cost_little_accuracy(factor_dtype, rtol):
    """Against float64, W and the queries rounded to 16 bits once cost the output and every gradient about their
    rounding: fp16 (11 significant bits) well under 1e-3, bf16 (8) under 1e-2."""
    config = DeltaLaunchConfig(key_tile=16, value_tile=16, factor_dtype=factor_dtype)
    check_against_float64(
        lambda *a: kernels.loglinear_gated_deltanet(*a, chunk_size=16, config=config),
        lambda *a: le.loglinear_attention(*a, form="chunkwise"),
        inputs(1, 150, 2, 2, 24, 40, seed=12), rtol=rtol, what=factor_dtype)


def test_16_bit_calls_store_w_and_the_queries_in_their_own_type_by_default():
    q, k, v, _, g, beta = (x.to(torch.float16) for x in inputs(1, 20, 1, 1, 16, 16))
    for config, stored in ((DeltaLaunchConfig(), torch.float16), (DeltaLaunchConfig(precision="exact"), torch.float32)):
        chunks = delta_chunks(q, k, v, beta, g, chunk_size=16, config=config)
        assert chunks.w.dtype == chunks.query.dtype == stored, config.precision


def test_factor_storage_is_chosen_by_the_call_unless_set_and_is_checked():
    """By default 16-bit calls store W and the queries in their own type under ``"fast"`` and in fp32 under
    ``"exact"``; fp32 and fp64 calls in their own type; a set ``factor_dtype`` holds for every call."""
    fast, exact = DeltaLaunchConfig(), DeltaLaunchConfig(precision="exact")
    for dtype in (torch.float16, torch.bfloat16):
        assert fast.factor_storage(dtype) == dtype and exact.factor_storage(dtype) == torch.float32
    for dtype in (torch.float32, torch.float64):
        assert fast.factor_storage(dtype) == exact.factor_storage(dtype) == dtype
    assert DeltaLaunchConfig(factor_dtype="float32").factor_storage(torch.bfloat16) == torch.float32
    assert DeltaLaunchConfig(factor_dtype="float16").factor_storage(torch.float64) == torch.float16
    assert DeltaLaunchConfig(factor_dtype="bfloat16", precision="exact").factor_storage(torch.float16) == torch.bfloat16
    with pytest.raises(ValueError, match="factor_dtype must be one of"):
        DeltaLaunchConfig(factor_dtype="float64")


def test_the_reverse_walk_takes_its_own_value_tile(monkeypatch):
    """``adjoint_value_tile`` cuts the stacked reverse walk's value columns into more programs than ``value_tile``
    (V = 32: one program per head at the value tile of 32, two at 16)."""
    from loglin_edu.kernels import step8_delta_backward

    grids, kernel = [], step8_delta_backward.level_adjoint_walk_kernel

    class Recorded:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(step8_delta_backward, "level_adjoint_walk_kernel", Recorded())
    args = [x.float().requires_grad_(True) for x in inputs(1, 40, 1, 1, 16, 32)]
    for tile in (None, 16):
        config = DeltaLaunchConfig(value_tile=32, adjoint_value_tile=tile)
        kernels.loglinear_gated_deltanet(*args, chunk_size=16, config=config).sum().backward()
    assert [grid[0] for grid in grids] == [1, 2]

@pytest.mark.parametrize("extra_columns", [0, 27], ids=["L9-exactly-the-levels", "L36-wider-than-needed"])
def test_level_scales_of_any_width_match_float64(extra_columns):
    """λ is read and dλ written one column per level. T = 150 in chunks of 16 needs 9 levels (4 inside a
    chunk plus level 0, 4 chunk levels): not a power of two; 27 more columns make λ wider than any tile of
    the levels. V = 20 is two value tiles, so each read's dλ is summed over tiles. o and every gradient
    match float64, and dλ of the columns no pair uses is zero."""
    B, T, H, C = 1, 150, 1, 16
    q, k, v, _, g, beta = inputs(B, T, H, 1, 8, 20, seed=13)
    levels = le.num_levels(T)
    assert levels == 9
    lam = (0.5 + torch.rand(B, T, H, levels + extra_columns, generator=torch.Generator().manual_seed(14))).to(q)
    grads = check_against_float64(
        lambda *a: kernels.loglinear_gated_deltanet(*a, chunk_size=C, config=SMALL_TILES),
        lambda *a: le.loglinear_attention(*a, form="chunkwise"),
        [q, k, v, lam, g, beta], rtol=2e-6, what=f"T={T}, L={lam.shape[-1]}",
    )
    assert not grads[3][..., levels:].any(), "dλ written in a column no pair uses"


def test_the_public_form_with_two_key_tiles_and_no_decay():
    """``loglinear_attention(..., beta=..., form="triton")`` is log-linear DeltaNet when log_decay is None;
    K = 130 is a tile of 128 and one of 16, V = 20 one tile."""
    q, k, v, lam, _, beta = inputs(1, 20, 2, 1, 130, 20, seed=3, decay=False)
    check_against_float64(
        lambda q, k, v, lam, beta: le.loglinear_attention(q, k, v, lam, None, beta, form="triton", chunk_size=16),
        lambda q, k, v, lam, beta: le.loglinear_attention(q, k, v, lam, None, beta, form="chunkwise"),
        [q, k, v, lam, beta], rtol=2e-6, what="form='triton', K=130",
    )


def test_float64_is_exact():
    q, k, v, lam, g, beta = inputs(1, 77, 2, 2, 6, 5, seed=5)
    out = le.loglinear_attention(q, k, v, lam, g, beta, form="triton", chunk_size=16)
    assert_close(out, le.loglinear_attention(q, k, v, lam, g, beta, form="naive"), rtol=1e-12, what="fp64")


@pytest.mark.parametrize("dtype, allowed", [(torch.float32, {"ieee", "tf32x3"}), (torch.float64, {"ieee"})])
def test_fp32_and_fp64_products_are_never_rounded_to_tf32(monkeypatch, dtype, allowed):
    """The precision every kernel of a forward and backward is launched with (the interpreter multiplies
    exactly whatever it is told, so only the launch arguments show it): fp32 calls only exact or tf32x3
    products (plain tf32 would miss fp32's bound by two orders of magnitude), fp64 calls only exact ones."""
    from loglin_edu.kernels import step6_delta_chunks, step7_delta_levels, step8_delta_backward

    launched = []

    class Recorded:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((self.name, kwargs["IP"], kwargs.get("IPS", kwargs["IP"])))
                return self.kernel[grid](*args, **kwargs)
            return launch

    names = {step6_delta_chunks: ["delta_chunk_kernel"],
             step7_delta_levels: ["level_walk_kernel", "level_state_walk_kernel", "delta_output_kernel"],
             step8_delta_backward: ["level_adjoint_walk_kernel", "slot_gram_kernel", "level_walk_bwd_kernel",
                                    "level_gram_kernel", "level_gram_grads_kernel",
                                    "level_write_grad_kernel", "level_transition_grad_kernel",
                                    "level_read_grad_kernel", "delta_chunk_values_bwd_kernel",
                                    "delta_chunk_solve_bwd_kernel", "delta_chunk_qk_bwd_kernel"]}
    for module in names:
        for name in names[module]:
            monkeypatch.setattr(module, name, Recorded(name, getattr(module, name)))
    q, k, v, lam, g, beta = (x.to(dtype).requires_grad_(True) for x in inputs(1, 40, 2, 2, 20, 8))
    for knobs in ({}, *SCHEDULES.values()):
        config = DeltaLaunchConfig(**{"key_tile": 16, "value_tile": 16, **knobs})
        kernels.loglinear_gated_deltanet(q, k, v, lam, g, beta, chunk_size=16, config=config).sum().backward()
    assert {name for name, *_ in launched} == {name for module in names for name in names[module]}
    assert {p for _, *precisions in launched for p in precisions} <= allowed, launched


def test_fp16_inputs_match_float64_of_the_same_rounded_inputs():
    """fp16 through the whole Function (16-bit products of q, k, v; W and the queries stored in fp16, the other
    factors and the states in fp32): o and every gradient within fp16's rounding of the float64 result on the
    same inputs."""
    q, k, v, lam, g, beta = inputs(1, 80, 2, 1, 16, 16, seed=8)
    check_against_float64(
        lambda *a: kernels.loglinear_gated_deltanet(*a, chunk_size=16),
        lambda *a: le.loglinear_attention(*a, form="chunkwise"),
        [q, k, v, lam, g, beta], rtol=2e-3, what="fp16", dtype=torch.float16,
    )


def test_the_triton_form_hands_its_state_to_decoding():
    """``return_state=True`` on the Triton form with β: the prefill's Fenwick state (float32), stepped on by the
    recurrent decoding state, continues the sequence as the float64 masked form computes it."""
    q, k, v, lam, g, beta = inputs(1, 40, 2, 2, 4, 4, seed=9)
    full = le.loglinear_attention(q, k, v, lam, g, beta, form="naive")
    t = 37
    head, state = le.loglinear_attention(*(x[:, :t].float() for x in (q, k, v, lam, g, beta)), form="triton",
                                         chunk_size=16, return_state=True)
    assert all(s.dtype == torch.float32 for s in state.levels if s is not None)
    tail = [state.step(*(x[:, s].float() for x in (q, k, v, lam, g, beta)))
            for s in range(t, 40)]
    out = torch.cat([head, torch.stack(tail, dim=1)], dim=1)
    assert_close(out.double(), full, rtol=1e-5, what="triton prefill + decoding")


def test_unit_level_scales_give_gated_deltanet():
    """λ ≡ 1: the log-linear kernels compute Gated DeltaNet itself."""
    q, k, v, lam, g, beta = (x.float() for x in inputs(1, 60, 2, 2, 8, 8, seed=6))
    out = le.loglinear_attention(q, k, v, torch.ones_like(lam), g, beta, form="triton", chunk_size=16)
    ref = le.gated_deltanet_attention(q.double(), k.double(), v.double(), g.double(), beta.double(), form="chunkwise")
    assert_close(out.double(), ref, rtol=2e-6, what="λ ≡ 1")


def test_too_wide_keys_are_refused():
    q, k, v, lam, g, beta = (x.float() for x in inputs(1, 4, 1, 1, 257, 2))
    with pytest.raises(ValueError, match="K <= 256"):
        kernels.loglinear_gated_deltanet(q, k, v, lam, g, beta)


def test_backward_fills_no_zero_gradient_for_the_saved_tensors():
    """The factors and states are outputs of the Function only to be saved: autograd must not zero-fill their
    gradients (the states alone are ``Σ popcount(c)`` blocks of ``K × V``)."""
    q, k, v, lam, g, beta = (x.float().requires_grad_(True) for x in inputs(1, 64, 1, 1, 16, 16))
    o = kernels.loglinear_gated_deltanet(q, k, v, lam, g, beta, chunk_size=16)
    sizes = zero_fill_sizes(lambda: o.sum().backward())
    states = 4 * 16 * 16  # Σ_{c<4} popcount(c) = 4 states of K x V
    assert all(n < states for n in sizes), sizes


@pytest.mark.slow
def test_vmap_folds_the_mapped_dimension_into_the_batch():
    """``vmap`` over a stack of M problems, some inputs mapped and some shared, equals a loop over the members."""
    from torch.func import vmap

    M, B, T, H, K, V = 2, 1, 40, 2, 8, 5
    q, k, v, lam, g, beta = inputs(M * B, T, H, 1, K, V, seed=5, dtype=torch.float32)
    q, v, g, beta = (x.unflatten(0, (M, B)) for x in (q, v, g, beta))  # mapped; k, λ shared
    k, lam = k[:B], lam[:B]
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v, lam, g, beta)]
    weights = torch.randn(M, B, T, H, V, generator=torch.Generator().manual_seed(0)).to(q)

    def call(q_, k_, v_, lam_, g_, beta_):
        return kernels.loglinear_gated_deltanet(q_, k_, v_, lam_, g_, beta_, chunk_size=16)

    out = vmap(call, in_dims=(0, None, 0, None, 0, 0))(*leaves)
    grads = torch.autograd.grad((out * weights).sum(), leaves)
    loop = [x.detach().requires_grad_(True) for x in (q, k, v, lam, g, beta)]
    ref = torch.stack([call(loop[0][m], loop[1], loop[2][m], loop[3], loop[4][m], loop[5][m]) for m in range(M)])
    ref_grads = torch.autograd.grad((ref * weights).sum(), loop)
    assert_close(out.double(), ref.double(), rtol=1e-6, what="vmap: o")
    for name, a, b in zip(("dq", "dk", "dv", "dlevel_scales", "dlog_decay", "dbeta"), grads, ref_grads):
        assert_close(a.double(), b.double(), rtol=1e-6, atol=1e-6, what=f"vmap: {name}")


# --- guard bands -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [True, False])
def test_guard_bands_no_read_or_write_out_of_bounds(shared):
    """Inputs and outputs are views into NaN-padded buffers: a read outside an input would bring NaN into the
    results (compared with float64), a write outside an output would overwrite a NaN of its pad."""
    from loglin_edu.kernels.step8_delta_backward import chunk_reverse_cumsum

    B, T, H, K, V, C = 2, 40, 2, 20, 18, 16
    Hk = 1 if shared else H
    dense = [x.float() for x in inputs(B, T, H, Hk, K, V, seed=7)]
    views = [padded_copy(x)[1] for x in dense]
    q, k, v, lam, g, beta = views
    o_buffer, o = padded_view((B, T, H, V))
    _, chunks, states = loglinear_delta_forward(q, k, v, lam, beta, g, C, SMALL_TILES, out=o)
    buffers = {name: padded_view(shape) for name, shape in [("dv", (B, T, H, V)), ("dlam", tuple(lam.shape))]}
    buffers["dlam"][1].zero_()
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    dq, dk, dv, dlam, dbeta, d_gc = loglinear_delta_backward(q, k, v, lam, chunks, states, do, C, SMALL_TILES,
                                                             grads={name: view for name, (_, view) in buffers.items()})
    assert guard_intact(o_buffer) and all(guard_intact(buf) for buf, _ in buffers.values())
    leaves = [x.double().requires_grad_(True) for x in dense]
    ref = le.loglinear_attention(*leaves, form="chunkwise")
    ref_grads = torch.autograd.grad((ref * do.double()).sum(), leaves)
    got = (dq, dk, dv, dlam, chunk_reverse_cumsum(d_gc, T, C), dbeta)
    assert_close(o.double(), ref, rtol=2e-6, what="o")
    for name, a, b in zip(NAMES, got, ref_grads):
        assert_close(a.double(), b, rtol=2e-6, atol=1e-6, what=name)


# --- the layer's Triton backend ------------------------------------------------------------------------


def test_layer_triton_backend_matches_torch():
    """The log-linear Gated DeltaNet layer on backend="triton" (picked by ``ops.resolve_backend``) computes the
    torch backend's output and parameter gradients."""
    from loglin_edu.layers import LogLinearGatedDeltaNet

    torch.manual_seed(0)
    layer = LogLinearGatedDeltaNet(16, num_heads=2, max_len=64, chunk_size=16, backend="torch").to(DEVICE)
    x = torch.randn(2, 40, 16, device=DEVICE)
    results = {}
    for backend in ("torch", "triton"):
        layer.backend = backend
        layer.zero_grad()
        out = layer(x)
        (out * torch.linspace(-1, 1, out.numel(), device=DEVICE).view_as(out)).sum().backward()
        results[backend] = (out.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()})
    assert_close(results["triton"][0], results["torch"][0], rtol=1e-5, what="layer output")
    for name, grad in results["torch"][1].items():
        assert_close(results["triton"][1][name], grad, rtol=1e-4, atol=1e-7, what=name)


@pytest.mark.slow
def test_training_on_the_triton_backend_matches_torch(tmp_path):
    """Three training steps of a two-member ensemble (vmap over members, so through the Function's vmap rule)
    of log-linear Gated DeltaNet on MQAR: the same losses and weights, to fp32 round-off, on both backends. (AdamW
    divides each gradient by its running size, so where a gradient is nearly zero a round-off difference moves
    a weight by up to a learning rate: weights agree to 1e-4, losses to 1e-5.)"""
    from loglin_edu.data import mqar
    from loglin_edu.layers import ModelConfig
    from loglin_edu.train import Member, TrainConfig, train

    train_sets, test_sets = [mqar(8, 40, 4, 32, seed=1)], {"pairs=4": mqar(2, 40, 4, 32, seed=2)}
    config = TrainConfig(steps=3, batch_size=2, warmup_steps=1, eval_every=3, eval_batch_size=2)
    records = {}
    for backend in ("torch", "triton"):
        model = ModelConfig("loglinear_gated_deltanet", vocab_size=32, d_model=16, n_layers=1, max_len=64,
                            mixer_options=dict(num_heads=2, chunk_size=16, backend=backend))
        records[backend] = train(model, [Member(0, 3e-3), Member(1, 1e-2)], train_sets, test_sets, config,
                                 out_dir=tmp_path / backend, progress=False, device=DEVICE)
    for a, b in zip(records["triton"]["history"], records["torch"]["history"]):
        assert abs(a["train_loss"] - b["train_loss"]) <= 1e-5 * abs(b["train_loss"]), (a, b)
    weights = {b: torch.load(tmp_path / b / "checkpoint.pt", weights_only=False)["models"] for b in records}
    for triton_member, torch_member in zip(weights["triton"], weights["torch"]):
        for name, value in torch_member.items():
            assert_close(triton_member[name], value, rtol=1e-4, atol=1e-7, what=name)


# --- the benchmark's CPU tier ----------------------------------------------------------------------


def test_benchmark_cpu_tier(tmp_path):
    from loglin_edu.bench.__main__ import main
    from loglin_edu.bench.settings import GDN_CPU, counted_work

    result = main(["--model", "gated_deltanet", "--tier", "cpu", "--lengths", "32", "--quiet",
                   "--out", str(tmp_path / "b.json")])
    rows = {r["name"]: r for r in result["rows"]}
    assert set(rows) == {"loglinear gated deltanet (ours, triton)", "loglinear gated deltanet (torch chunkwise)",
                         "sdpa (causal, flash on GPU)"}
    assert all("forward_backward_ms" in r for r in rows.values()), rows
    assert (tmp_path / "b.json").exists() and (tmp_path / "b.png").exists() and result["complete"]
    assert result["setting"]["model"] == "gated_deltanet" and result["setting"]["key"] == GDN_CPU.key
    work = counted_work(2, 32, GDN_CPU)
    assert work["forward_flops"] > 0 and work["backward_flops"] > work["forward_flops"]


def test_level_gradient_knobs_follow_the_precision_and_are_checked():
    assert DeltaLaunchConfig().level_grad_value_tile() == 64
    assert DeltaLaunchConfig(precision="exact").level_grad_value_tile() == 32
    assert DeltaLaunchConfig(grad_value_tile=16).level_grad_value_tile() == 16
    with pytest.raises(ValueError, match="grad_value_tile >= 32"):
        DeltaLaunchConfig(precision="exact", grad_value_tile=16)
    with pytest.raises(ValueError, match="power of two"):
        DeltaLaunchConfig(grad_value_tile=24)
    with pytest.raises(ValueError, match="backward_walk must be"):
        DeltaLaunchConfig(backward_walk="tree")
    with pytest.raises(ValueError, match="forward_walk must be"):
        DeltaLaunchConfig(forward_walk="tree")
    with pytest.raises(ValueError, match="adjoint_value_tile must be a power of two"):
        DeltaLaunchConfig(adjoint_value_tile=48)


def test_each_kernel_group_takes_its_own_stages_or_num_stages():
    config = DeltaLaunchConfig(num_stages=2, read_stages=None, gram_stages=3)
    assert [config.stages(group) for group in ("walk", "read", "gram")] == [2, 2, 3]
    assert DeltaLaunchConfig().stages("read") == 3 and DeltaLaunchConfig().stages("walk") == 1
    assert DeltaLaunchConfig(walk_stages=1, read_stages=4).stages("read") == 4
    with pytest.raises(ValueError, match="group must be"):
        config.stages("chunk")
    with pytest.raises(ValueError, match="read_stages must be a positive integer or None"):
        DeltaLaunchConfig(read_stages=0)
    with pytest.raises(ValueError, match="num_stages must be a positive integer, got None"):
        DeltaLaunchConfig(num_stages=None)


def test_walks_launch_with_their_warps_stages_and_register_caps():
    config = DeltaLaunchConfig(walk_warps=8, walk_stages=2, adjoint_max_registers=168)
    assert config.walk_launch() == {"num_warps": 8, "num_stages": 2}
    assert config.walk_launch(reverse=True) == {"num_warps": 8, "num_stages": 2, "maxnreg": 168}
    assert DeltaLaunchConfig(walk_max_registers=128).walk_launch()["maxnreg"] == 128
    with pytest.raises(ValueError, match=r"walk_max_registers must be None or an integer in \[24, 255\]"):
        DeltaLaunchConfig(walk_max_registers=256)


@pytest.mark.parametrize("N", [1, 2, 3, 16, 17, 1024])
def test_read_slot_count_is_the_last_first_slot(N):
    """The host's count of read states equals the device table's last entry (the brute count of live levels)."""
    assert read_slot_count(N) == int(first_slots(N, torch.device("cpu"))[-1]) == sum(bin(c).count("1") for c in range(N))
