"""The tensor decoding state (one ``[B, H, L, K, V]`` buffer of the next query's levels) gives the outputs of the
list-of-levels FenwickState and of the step it replaced, holds the levels of their definition, takes over a
prefill's state, handles the last token of ``max_len``, and compiles to one graph; its lazy layout (levels with
decay scales) steps exactly like the eager one."""

import pytest
import torch
from hypothesis import given, strategies as st

import loglin_edu as le
from loglin_edu.decoding import FenwickCache, carry_masks, fenwick_step, lazy_fenwick_step, live_levels
from loglin_edu.state import carried_keys
from operators import LOGLINEAR, assert_close
from test_prefill import split_args

IDS = [op.name for op in LOGLINEAR]


def heads_first_step(x, t, H):
    """Token ``t`` of a ``[B, T, Hx, ...]`` input as ``[B, H, ...]`` (a shared head broadcast)."""
    if x is None:
        return None
    x = x[:, t]
    return x.expand(x.shape[0], H, *x.shape[2:]) if x.dim() == 3 else x


def step_args(args, t, H):
    return [heads_first_step(x, t, H) for x in args]


def next_query_levels(k, v, log_decay, beta, t, slots):
    """The buffer after ``t`` tokens from its definition: slot ``i`` holds bucket ``i + 1`` of the next query
    ``t``, carried to the last token, ``Σ_{s in bucket(t, i + 1)} P_{t-1,s} β_s k_s v_sᵀ``.

    k: ``[B, T, Hk, K]``; v: ``[B, T, H, V]``; log_decay, beta: ``[B, T, H]`` or None. Returns ``[B, H, slots, K, V]``.
    """
    B, _, H, V = v.shape
    out = torch.zeros(B, H, slots, k.shape[-1], V, dtype=v.dtype)
    if t == 0:
        return out
    heads = lambda x: None if x is None else x[:, :t].transpose(1, 2)  # noqa: E731
    keys = carried_keys(heads(k).expand(B, H, t, -1), heads(log_decay), heads(beta))
    values = heads(v)
    for i in range(slots):
        bucket = le.bucket(t, i + 1)
        if len(bucket):
            out[:, :, i] = keys[:, :, bucket.start : bucket.stop].transpose(-1, -2) @ values[:, :, bucket.start : bucket.stop]
    return out


def with_levels(lam, levels):
    """λ ``[B, T, H, ·]`` padded with copies of its column 0 up to ``levels`` columns."""
    return torch.cat([lam, lam[..., :1].expand(*lam.shape[:-1], levels - lam.shape[-1])], -1)


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
@pytest.mark.parametrize("shared_qk", [False, True], ids=["per_head", "shared_qk"])
def test_tensor_step_equals_the_list_state(op, shared_qk):
    """Outputs equal the list state's after every token; the buffer holds the next query's levels by definition."""
    T, H, max_len = 70, 2, 100
    args = list(split_args(op, op.inputs(B=2, T=T, H=H, K=3, V=4, seed=1, shared_qk=shared_qk)))
    args[3] = with_levels(args[3], le.num_levels(max_len))
    q, k, v, lam, g, b = args
    listed, cache = le.FenwickState(), FenwickCache.empty(2, H, 3, 4, max_len, dtype=torch.float64)
    for t in range(T):
        step = step_args(args, t, H)
        expected = listed.step(*step)
        assert_close(cache.step(*step), expected, rtol=1e-12, what=f"{op.name} output at t={t}")
        if t % 7 == 6 or t in (0, 1, 63, 64):
            defined = next_query_levels(k, v, g, b, t + 1, cache.stored_levels)
            assert_close(cache.level_values(), defined, rtol=1e-12, what=f"{op.name} levels after {t + 1} tokens")


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
def test_lazy_layout_steps_like_the_eager_one(op):
    """Every operator, per-head q, k: outputs and level values of the lazy layout equal the eager cache's and
    the list state's after every token; without the delta rule every stored tile but the carry's target is left
    as it was."""
    T, H, max_len = 40, 2, 64
    args = list(split_args(op, op.inputs(B=2, T=T, H=H, K=3, V=4, seed=4)))
    args[3] = with_levels(args[3], le.num_levels(max_len))
    eager = FenwickCache.empty(2, H, 3, 4, max_len, dtype=torch.float64)
    lazy = FenwickCache.empty(2, H, 3, 4, max_len, dtype=torch.float64, lazy=True)
    listed = le.FenwickState()
    for t in range(T):
        step = step_args(args, t, H)
        before = lazy.levels.clone()
        expected = eager.step(*step)
        assert_close(lazy.step(*step), expected, rtol=1e-12, what=f"{op.name} lazy output at t={t}")
        assert_close(listed.step(*step), expected, rtol=1e-12, what=f"{op.name} list output at t={t}")
        assert_close(lazy.level_values(), eager.levels, rtol=1e-12, what=f"{op.name} level values after t={t}")
        if not op.delta:
            j = ((t + 1) & -(t + 1)).bit_length() - 1  # the carry of token t fills slot j
            untouched = [slot for slot in range(lazy.stored_levels) if slot != j]
            assert torch.equal(lazy.levels[:, :, untouched], before[:, :, untouched]), (op.name, t)


def test_lazy_layout_scales_and_empty_levels():
    """Empty levels have scale 0 and are never read (NaN content changes nothing); the carry's target gets
    scale 1 and every other live level its scale times the token's decay; a prefill's state converts with
    scale 1."""
    gen = torch.Generator().manual_seed(5)
    B, H, K, V = 2, 2, 3, 4
    lazy = FenwickCache.empty(B, H, K, V, max_len=32, dtype=torch.float64, lazy=True)
    eager = FenwickCache.empty(B, H, K, V, max_len=32, dtype=torch.float64)
    listed = le.FenwickState()
    for t in range(13):
        x = [torch.randn(B, H, K, generator=gen, dtype=torch.float64) for _ in range(2)]
        v, lam = torch.randn(B, H, V, generator=gen, dtype=torch.float64), torch.rand(B, H, 6, generator=gen)
        g = -torch.rand(B, H, generator=gen, dtype=torch.float64)
        dead = ~lazy.live()[:, None, :, None, None].expand_as(lazy.levels)
        lazy.levels[dead] = float("nan")
        scales_before = lazy.decay_scales.clone()
        expected = eager.step(*x, v, lam.double(), g)
        listed.step(*x, v, lam.double(), g)
        assert_close(lazy.step(*x, v, lam.double(), g), expected, rtol=1e-12, what=f"t={t}")
        live = lazy.live()[:, None, :, None].expand_as(lazy.decay_scales)
        assert (lazy.decay_scales[~live] == 0).all() and (lazy.decay_scales[live] > 0).all(), t
        j = ((t + 1) & -(t + 1)).bit_length() - 1  # the carry's target
        assert torch.equal(lazy.decay_scales[:, :, j], torch.ones(B, H, V, dtype=torch.float64)), t
        kept = [slot for slot in range(j + 1, lazy.stored_levels)]
        assert torch.equal(lazy.decay_scales[:, :, kept], scales_before[:, :, kept] * g.exp()[:, :, None, None]), t
    converted = FenwickCache.from_state(listed, max_len=32, lazy=True)
    assert torch.equal(converted.decay_scales, converted.live()[:, None, :, None].double().expand(B, H, 5, V))
    assert_close(converted.level_values(), eager.levels, rtol=1e-12, what="lazy from_state")
    assert converted.state_bytes() == B * H * 5 * (K * V + V) * 8


def test_lazy_step_traces_to_one_graph_without_breaks():
    cache, steps = compile_inputs()
    lazy = FenwickCache.empty(*cache.levels.shape[:2], *cache.levels.shape[3:], cache.max_len, lazy=True)
    explained = torch._dynamo.explain(lazy_fenwick_step)(lazy.levels, lazy.decay_scales, lazy.position, *steps[0])
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_live_levels_are_the_bits_of_the_position():
    """Slot i (level i + 1) is live after t tokens iff bucket i + 1 of the next query t holds keys: bit i of t."""
    positions = torch.arange(0, 300)
    live = live_levels(positions, 9)
    for t in positions.tolist():
        assert live[t].tolist() == [len(le.bucket(t, i + 1)) > 0 for i in range(9)], t
        assert live[t].sum().item() == bin(t).count("1")


def test_carry_masks_name_the_trailing_zeros_of_the_next_position():
    into, cleared = carry_masks(torch.arange(0, 200), 6)
    for t in range(200):
        j = ((t + 1) & -(t + 1)).bit_length() - 1  # level j + 1 receives the carry of token t
        assert into[t].nonzero().flatten().tolist() == ([j] if j < 6 else []), t  # past the buffer: no slot
        assert cleared[t].nonzero().flatten().tolist() == list(range(min(j, 6))), t


def test_sequences_at_different_positions_share_one_step():
    """One batch holds a sequence at position 0 and one mid-way: each steps as it would alone."""
    op = LOGLINEAR[-1]
    q, k, v, lam, g, b = split_args(op, op.inputs(B=2, T=30, H=2, K=3, V=2, seed=2))
    alone = [FenwickCache.empty(1, 2, 3, 2, 64, dtype=torch.float64) for _ in range(2)]
    for t in range(11):  # sequence 1 starts 11 tokens ahead
        alone[1].step(*(x[1:] for x in step_args((q, k, v, lam, g, b), t, 2)))
    both = FenwickCache(torch.cat([alone[0].levels, alone[1].levels]), torch.tensor([0, 11]), 64)
    for t in range(19):
        inputs = [torch.stack([x[0, t], x[1, t + 11]]) for x in (q, k, v, lam, g, b)]
        inputs = [x.expand(2, 2, *x.shape[2:]) if x.dim() == 3 else x for x in inputs]
        out = both.step(*inputs)
        for i in range(2):
            assert_close(out[i : i + 1], alone[i].step(*(x[i : i + 1] for x in inputs)), rtol=1e-12, what=f"seq {i}")
    assert both.position.tolist() == [19, 30]


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_prefill_state_converts_and_decodes_on(op, lazy):
    T, t, H = 50, 21, 2
    q, k, v, lam, g, b = split_args(op, op.inputs(B=2, T=T, H=H, K=3, V=2, seed=3))
    full = le.loglinear_attention(q, k, v, lam, g, b, form="naive")
    head, state = le.loglinear_attention(
        *(None if x is None else x[:, :t] for x in (q, k, v, lam, g, b)), chunk_size=8, return_state=True
    )
    cache = FenwickCache.from_state(state, max_len=T, lazy=lazy)
    assert_close(cache.level_values(), next_query_levels(k, v, g, b, t, cache.stored_levels), what="converted")
    tail = [cache.step(*step_args((q, k, v, lam, g, b), s, H)) for s in range(t, T)]
    assert_close(torch.cat([head, torch.stack(tail, dim=1)], dim=1), full, what=f"{op.name} prefill + tensor decoding")


def test_cache_refuses_to_decode_past_max_len_and_too_few_level_scales():
    cache = FenwickCache.empty(1, 1, 2, 2, max_len=5)
    x, lam = torch.randn(1, 1, 2), torch.ones(1, 1, le.num_levels(5))
    for _ in range(5):
        cache.step(x, x, x, lam)
    with pytest.raises(ValueError, match="decoding past max_len=5"):
        cache.step(x, x, x, lam)
    with pytest.raises(ValueError, match="level_scales has L=2 levels but a step reads 4"):
        FenwickCache.empty(1, 1, 2, 2, max_len=5).step(x, x, x, lam[..., :2])
    with pytest.raises(ValueError, match="position 0"):
        FenwickCache.from_state(le.FenwickState(), max_len=5)
    with pytest.raises(ValueError, match="position 9, past max_len=5"):
        FenwickCache.from_state(le.FenwickState([torch.zeros(1, 1, 2, 2)], position=9), max_len=5)


@pytest.mark.parametrize("max_len", [1, 2, 3, 5, 8, 13, 16, 64, 2**20])
def test_the_buffer_holds_one_level_fewer_than_lambda(max_len):
    """``bit_length(max_len - 1)`` slots, the levels ``1..L``; a step reads ``num_levels(max_len)`` columns of λ."""
    cache = FenwickCache.empty(1, 2, 3, 4, max_len=max_len, lazy=True)
    assert cache.stored_levels == (max_len - 1).bit_length() == le.num_levels(max_len) - 1
    assert cache.num_levels == le.num_levels(max_len)
    assert cache.levels.shape == (1, 2, cache.stored_levels, 3, 4)
    assert cache.decay_scales.shape == (1, 2, cache.stored_levels, 4) and cache.live().shape == (1, cache.stored_levels)


def test_states_per_head_at_a_million_tokens():
    """20 K × V states per head at max_len = 2^20 (one fewer than the 21 levels of λ), and in the lazy layout
    their 20 decay-scale rows of V, 1/K of a state each."""
    B, H, K, V = 3, 4, 8, 16
    cache = FenwickCache.empty(B, H, K, V, max_len=2**20)
    assert cache.stored_levels == 20 and cache.num_levels == le.num_levels(2**20) == 21
    assert cache.state_bytes() == B * H * 20 * K * V * 4
    lazy = FenwickCache.empty(B, H, K, V, max_len=2**20, lazy=True)
    assert lazy.state_bytes() / (B * H * K * V * 4) == 20 + 20 / K


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("op", [LOGLINEAR[1], LOGLINEAR[3]], ids=[LOGLINEAR[1].name, LOGLINEAR[3].name])
@pytest.mark.parametrize("max_len", [1, 2, 8, 16, 13, 12])
def test_a_cache_filled_to_max_len(max_len, op, lazy):
    """Every token up to ``max_len``: the outputs of the forward. After them the state fits when ``max_len`` is not
    a power of two (the next query's levels by definition); when it is, its one level, ``L + 1``, lies past the
    buffer: the last carry drops it and the buffer reports every slot empty. Either way no step follows, and a
    prefill of all ``max_len`` tokens converts to the same buffer."""
    q, k, v, lam, g, b = split_args(op, op.inputs(B=2, T=max_len, H=2, K=3, V=2, seed=6))
    full = le.loglinear_attention(q, k, v, lam, g, b, form="naive")
    cache = FenwickCache.empty(2, 2, 3, 2, max_len, dtype=torch.float64, lazy=lazy)
    outs = [cache.step(*step_args((q, k, v, lam, g, b), t, 2)) for t in range(max_len)]
    assert_close(torch.stack(outs, dim=1), full, what=f"max_len={max_len}: every output")
    fits = max_len & (max_len - 1) != 0  # not a power of two (1 = 2^0 is one)
    defined = next_query_levels(k, v, g, b, max_len, cache.stored_levels)
    assert_close(cache.level_values(), defined, what=f"max_len={max_len}: the levels after the last token")
    assert bool(cache.live().any()) == fits
    assert fits or not defined.any()  # a power of two: the definition's levels 1..L are all empty too
    with pytest.raises(ValueError, match=f"decoding past max_len={max_len}"):
        cache.step(*step_args((q, k, v, lam, g, b), 0, 2))
    _, state = le.loglinear_attention(q, k, v, lam, g, b, form="recurrent", return_state=True)
    converted = FenwickCache.from_state(state, max_len, lazy=lazy)
    assert_close(converted.level_values(), cache.level_values(), what=f"max_len={max_len}: from_state")


def old_step(levels, t, q, k, v, lam, g, b):
    """The step the buffer replaced, as an independent reference: ``levels: [B, H, L + 1, K, V]`` with level 0 (the
    last token) and the buckets of the last query ``t - 1``; carry levels ``0..j`` into ``j + 1`` (``2^j = t & -t``),
    transition every level, write ``β k vᵀ`` into level 0, read ``Σ_l λ_l S^(l)ᵀ q``."""
    levels = levels.clone()
    if t > 0:
        j = (t & -t).bit_length() - 1
        levels[:, :, j + 1] = levels[:, :, : j + 2].sum(2)
        levels[:, :, : j + 1] = 0
    if b is not None:
        levels = levels - (b[..., None] * k)[:, :, None, :, None] * torch.einsum("bhk,bhlkv->bhlv", k, levels)[:, :, :, None]
    if g is not None:
        levels = levels * g.exp()[:, :, None, None, None]
    levels[:, :, 0] = (k if b is None else b[..., None] * k)[..., None] * v[..., None, :]
    return torch.einsum("bhl,bhk,bhlkv->bhv", lam[..., : levels.shape[2]], q, levels), levels


def last_query_levels(k, v, log_decay, beta, t, levels):
    """The replaced layout after ``t`` tokens from its definition: level ``l`` holds bucket ``l`` of the last query
    ``t - 1`` (level 0 its own token), carried to it. Shapes as :func:`next_query_levels`; ``[B, H, levels, K, V]``."""
    out = torch.zeros(v.shape[0], v.shape[2], levels, k.shape[-1], v.shape[-1], dtype=v.dtype)
    if t == 0:
        return out
    state = le.state.prefix_state(*(None if x is None else x[:, :t].transpose(1, 2)
                                    for x in (k.expand(*v.shape[:3], -1), v, log_decay, beta)))
    for lvl, s in enumerate(state.levels):
        if s is not None:
            out[:, :, lvl] = s
    return out


POSITIONS = st.one_of(st.integers(0, 1100), st.sampled_from([2**p + d for p in range(11) for d in (-1, 0, 1)]))


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
@given(position=POSITIONS, seed=st.integers(0, 2**16))
def test_the_step_gives_the_outputs_of_the_step_it_replaced(op, lazy, position, seed):
    """From the state after ``position`` tokens (both layouts built from their definitions), three tokens through
    the buffer's step and through the replaced one (:func:`old_step`): the same outputs, to float64 rounding; the
    buffer after them holds the next query's levels by definition. The lazy buffer starts from random scales with
    NaN in its empty tiles."""
    gen = torch.Generator().manual_seed(seed)
    T, max_len = position + 3, 2**11 + 2
    q, k, v, lam, g, b = split_args(op, op.inputs(B=2, T=T, H=2, K=3, V=2, seed=seed))
    lam = with_levels(lam, le.num_levels(max_len))
    cache = FenwickCache.empty(2, 2, 3, 2, max_len, dtype=torch.float64, lazy=lazy)
    values = next_query_levels(k, v, g, b, position, cache.stored_levels)
    cache.position.fill_(position)
    if lazy:
        live = cache.live()[:, None, :, None]
        scales = torch.where(live, 0.5 + 0.5 * torch.rand(2, 2, cache.stored_levels, 1, generator=gen,
                                                          dtype=torch.float64), 0)
        cache.decay_scales.copy_(scales.expand_as(cache.decay_scales))
        cache.levels.copy_(torch.where(live[..., None], values / scales[..., None], float("nan")))
    else:
        cache.levels.copy_(values)
    old = last_query_levels(k, v, g, b, position, cache.num_levels)
    for t in range(position, T):
        step = step_args((q, k, v, lam, g, b), t, 2)
        wanted, old = old_step(old, t, *step)
        assert_close(cache.step(*step), wanted, rtol=1e-12, what=f"{op.name} at position {t}")
    assert_close(cache.level_values(), next_query_levels(k, v, g, b, T, cache.stored_levels), rtol=1e-12,
                 what=f"{op.name}: the levels after {T} tokens")


def compile_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, H, K, V, max_len = 2, 3, 4, 5, 40
    cache = FenwickCache.empty(B, H, K, V, max_len)
    steps = [
        (torch.randn(B, H, K, generator=gen), torch.randn(B, H, K, generator=gen), torch.randn(B, H, V, generator=gen),
         torch.rand(B, H, cache.num_levels, generator=gen), -torch.rand(B, H, generator=gen),
         torch.rand(B, H, generator=gen))
        for _ in range(12)
    ]
    return cache, steps


def run_steps(step_fn, cache, steps):
    levels, position, outs = cache.levels, cache.position, []
    for args in steps:
        out, levels, position = step_fn(levels, position, *args)
        outs.append(out)
    return torch.stack(outs), levels


def test_step_traces_to_one_graph_without_breaks():
    cache, steps = compile_inputs()
    explained = torch._dynamo.explain(fenwick_step)(cache.levels, cache.position, *steps[0])
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_compiled_step_never_recompiles_as_the_position_moves():
    torch._dynamo.reset()
    cache, steps = compile_inputs()
    compiled = torch.compile(fenwick_step, fullgraph=True, dynamic=False, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        outs, levels = run_steps(compiled, cache, steps)
    ref_outs, ref_levels = run_steps(fenwick_step, cache, steps)
    torch.testing.assert_close(outs, ref_outs, rtol=0, atol=0)
    torch.testing.assert_close(levels, ref_levels, rtol=0, atol=0)


@pytest.mark.slow
def test_inductor_compiled_step_matches_eager():
    """torch.compile with inductor (C++ on a CPU): about 20 s of compilation."""
    torch._dynamo.reset()
    cache, steps = compile_inputs(seed=1)
    compiled = torch.compile(fenwick_step, fullgraph=True, dynamic=False)
    outs, levels = run_steps(compiled, cache, steps)
    ref_outs, ref_levels = run_steps(fenwick_step, cache, steps)
    torch.testing.assert_close(outs, ref_outs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(levels, ref_levels, rtol=1e-5, atol=1e-5)
