"""The tensor decoding state (one ``[B, H, L, K, V]`` buffer) steps exactly like the list-of-levels
FenwickState, holds the levels the binary counter says, takes over a prefill's state, and compiles to
one graph; its lazy layout (levels with decay scales) steps exactly like the eager one."""

import pytest
import torch

import loglin_edu as le
from loglin_edu.decoding import FenwickCache, carry_masks, fenwick_step, lazy_fenwick_step, live_levels
from operators import LOGLINEAR, assert_close
from test_prefill import split_args, states_equal

IDS = [op.name for op in LOGLINEAR]


def heads_first_step(x, t, H):
    """Token ``t`` of a ``[B, T, Hx, ...]`` input as ``[B, H, ...]`` (a shared head broadcast)."""
    if x is None:
        return None
    x = x[:, t]
    return x.expand(x.shape[0], H, *x.shape[2:]) if x.dim() == 3 else x


def step_args(args, t, H):
    return [heads_first_step(x, t, H) for x in args]


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
@pytest.mark.parametrize("shared_qk", [False, True], ids=["per_head", "shared_qk"])
def test_tensor_step_equals_the_list_state(op, shared_qk):
    T, H, max_len = 70, 2, 100
    args = list(split_args(op, op.inputs(B=2, T=T, H=H, K=3, V=4, seed=1, shared_qk=shared_qk)))
    lam = args[3]
    args[3] = torch.cat([lam, lam[..., :1].expand(-1, -1, -1, le.num_levels(max_len) - lam.shape[-1])], -1)
    listed, cache = le.FenwickState(), FenwickCache.empty(2, H, 3, 4, max_len, dtype=torch.float64)
    for t in range(T):
        step = step_args(args, t, H)
        expected = listed.step(*step)
        assert_close(cache.step(*step), expected, rtol=1e-12, what=f"{op.name} output at t={t}")
        states_equal(cache.to_state(), listed, f"{op.name} after t={t}")


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
def test_lazy_layout_steps_like_the_eager_one(op):
    """Every operator, per-head q, k: outputs and level values of the lazy layout equal the eager cache's and
    the list state's after every token; every stored tile but levels 0 and j + 1 is left as it was."""
    T, H, max_len = 40, 2, 64
    args = list(split_args(op, op.inputs(B=2, T=T, H=H, K=3, V=4, seed=4)))
    lam = args[3]
    args[3] = torch.cat([lam, lam[..., :1].expand(-1, -1, -1, le.num_levels(max_len) - lam.shape[-1])], -1)
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
        states_equal(lazy.to_state(), listed, f"{op.name} lazy after t={t}")
        if not op.delta:  # without the delta rule only level 0 and the carry's target change
            j = (t & -t).bit_length() - 1 if t else -1
            untouched = [lvl for lvl in range(lazy.num_levels) if lvl not in (0, j + 1)]
            assert torch.equal(lazy.levels[:, :, untouched], before[:, :, untouched]), (op.name, t)


def test_lazy_layout_scales_and_empty_levels():
    """Empty levels have scale 0 and are never read (NaN content changes nothing); the carry's target gets
    the decay of its token as its scale; a prefill's state converts with scale 1."""
    gen = torch.Generator().manual_seed(5)
    B, H, K, V = 2, 2, 3, 4
    lazy = FenwickCache.empty(B, H, K, V, max_len=32, dtype=torch.float64, lazy=True)
    eager = FenwickCache.empty(B, H, K, V, max_len=32, dtype=torch.float64)
    for t in range(13):
        x = [torch.randn(B, H, K, generator=gen, dtype=torch.float64) for _ in range(2)]
        v, lam = torch.randn(B, H, V, generator=gen, dtype=torch.float64), torch.rand(B, H, 6, generator=gen)
        g = -torch.rand(B, H, generator=gen, dtype=torch.float64)
        dead = ~lazy.live()[:, None, :, None, None].expand_as(lazy.levels)
        lazy.levels[dead] = float("nan")
        assert_close(lazy.step(*x, v, lam.double(), g), eager.step(*x, v, lam.double(), g), rtol=1e-12, what=f"t={t}")
        live = lazy.live()[:, None, :, None].expand_as(lazy.decay_scales)
        assert (lazy.decay_scales[~live] == 0).all() and (lazy.decay_scales[live] > 0).all(), t
        assert torch.equal(lazy.decay_scales[:, :, 0], torch.ones(B, H, V, dtype=torch.float64))
        if t in (2, 4, 8, 12):  # the carry into level j + 1 at token t: scale exp(g_t)
            j = (t & -t).bit_length() - 1
            assert torch.equal(lazy.decay_scales[:, :, j + 1], g.exp()[..., None].expand(B, H, V)), t
    state = eager.to_state()
    converted = FenwickCache.from_state(state, max_len=32, lazy=True)
    assert torch.equal(converted.decay_scales, converted.live()[:, None, :, None].double().expand(B, H, 6, V))
    states_equal(converted.to_state(), state, "lazy from_state")
    assert converted.state_bytes() == B * H * 6 * (K * V + V) * 8


def test_lazy_step_traces_to_one_graph_without_breaks():
    cache, steps = compile_inputs()
    lazy = FenwickCache.empty(*cache.levels.shape[:2], *cache.levels.shape[3:], cache.max_len, lazy=True)
    explained = torch._dynamo.explain(lazy_fenwick_step)(lazy.levels, lazy.decay_scales, lazy.position, *steps[0])
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_live_levels_follow_the_binary_counter():
    positions = torch.arange(0, 300)
    live = live_levels(positions, 10)
    for t in positions.tolist():
        expected = [t >= 1] + [t >= 1 and len(le.bucket(t - 1, lvl)) > 0 for lvl in range(1, 10)]
        assert live[t].tolist() == expected, t
        assert live[t].sum().item() == (0 if t == 0 else bin(t - 1).count("1") + 1)


def test_carry_masks_name_the_trailing_zeros():
    into, cleared = carry_masks(torch.arange(0, 200), 9)
    assert not into[0].any() and not cleared[0].any()
    for t in range(1, 200):
        j = (t & -t).bit_length() - 1
        assert into[t].nonzero().flatten().tolist() == [j + 1], t
        assert cleared[t].nonzero().flatten().tolist() == list(range(j + 1)), t


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
def test_prefill_state_converts_and_decodes_on(op):
    T, t, H = 50, 21, 2
    q, k, v, lam, g, b = split_args(op, op.inputs(B=2, T=T, H=H, K=3, V=2, seed=3))
    full = le.loglinear_attention(q, k, v, lam, g, b, form="naive")
    head, state = le.loglinear_attention(
        *(None if x is None else x[:, :t] for x in (q, k, v, lam, g, b)), chunk_size=8, return_state=True
    )
    cache = FenwickCache.from_state(state, max_len=T)
    states_equal(cache.to_state(), state, "converted")
    tail = [cache.step(*step_args((q, k, v, lam, g, b), s, H)) for s in range(t, T)]
    assert_close(torch.cat([head, torch.stack(tail, dim=1)], dim=1), full, what=f"{op.name} prefill + tensor decoding")


def test_cache_refuses_to_decode_past_max_len_and_too_few_level_scales():
    cache = FenwickCache.empty(1, 1, 2, 2, max_len=5)
    x, lam = torch.randn(1, 1, 2), torch.ones(1, 1, le.num_levels(5))
    for _ in range(5):
        cache.step(x, x, x, lam)
    with pytest.raises(ValueError, match="decoding past max_len=5"):
        cache.step(x, x, x, lam)
    with pytest.raises(ValueError, match="level_scales has L=2 levels but the cache holds 4"):
        FenwickCache.empty(1, 1, 2, 2, max_len=5).step(x, x, x, lam[..., :2])
    with pytest.raises(ValueError, match="position 0"):
        FenwickCache.from_state(le.FenwickState(), max_len=5)
    with pytest.raises(ValueError, match="position 9, past max_len=5"):
        FenwickCache.from_state(le.FenwickState([torch.zeros(1, 1, 2, 2)], position=9), max_len=5)


def test_state_bytes_are_the_buffer():
    cache = FenwickCache.empty(3, 4, 8, 16, max_len=2**20)
    assert cache.num_levels == 21
    assert cache.state_bytes() == 3 * 4 * 21 * 8 * 16 * 4


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
