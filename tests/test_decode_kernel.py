"""The Triton decode step of log-linear Mamba-2 (kernels/decode_step.py) against the tensor step of
:mod:`loglin_edu.decoding`: fp32 under Triton's interpreter on a CPU (compiled on a GPU), level buffers and
outputs, sequences at different positions, no access outside its tensors; its variants (the unrolled
schedule, the split schedule over key slices, the lazy layout) against the loop kernel and the float64 tensor
step."""

import re

import pytest
import torch

from kernel_helpers import DEVICE, guard_intact, padded_copy
from loglin_edu.decoding import FenwickCache, carry_masks, live_levels
from operators import assert_close

decode = pytest.importorskip("loglin_edu.kernels.decode_step")

from loglin_edu.kernels import interpreted  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
if DEVICE == "cpu" and not interpreted():
    pytest.skip("TRITON_INTERPRET=1 must be set before triton is imported", allow_module_level=True)


def random_step(gen, B, H, Hk, K, V, L, decay=True, dtype=torch.float32):
    """q, k ``[B, Hk, K]``, v ``[B, H, V]``, λ ``[B, H, L]``, log decay ``[B, H]`` (or None)."""
    x = [torch.randn(B, Hk, K, generator=gen), torch.randn(B, Hk, K, generator=gen), torch.randn(B, H, V, generator=gen),
         0.5 + torch.rand(B, H, L, generator=gen), -0.5 * torch.rand(B, H, generator=gen) if decay else None]
    return [None if a is None else a.to(DEVICE, dtype) for a in x]


def prepared_cache(B, H, K, V, max_len, positions, seed):
    """A cache whose sequences sit at ``positions``, filled by the tensor step with random tokens."""
    gen = torch.Generator().manual_seed(seed)
    caches = []
    for position in positions:
        cache = FenwickCache.empty(1, H, K, V, max_len, device=DEVICE)
        for _ in range(position):
            q, k, v, lam, g = random_step(gen, 1, H, H, K, V, cache.num_levels)
            cache.step(q, k, v, lam, g)
        caches.append(cache)
    return FenwickCache(torch.cat([c.levels for c in caches]), torch.cat([c.position for c in caches]), max_len)


def check_steps(cache, steps, block_v, what, Hk, decay=True):
    """Run ``steps`` tokens through the kernel and the tensor step side by side."""
    gen = torch.Generator().manual_seed(11)
    B, H, L, K, V = cache.levels.shape
    levels, position = cache.levels.clone(), cache.position.clone()
    for i in range(steps):
        q, k, v, lam, g = random_step(gen, B, H, Hk, K, V, L + 1, decay)
        expected = cache.step(q.expand(B, H, K), k.expand(B, H, K), v, lam, g)
        got = decode.decode_step_(levels, position, q, k, v, lam, g, schedule="loop", block_v=block_v)
        where = f"{what}, step {i} at positions {cache.position.tolist()}"
        assert_close(got.double(), expected.double(), rtol=1e-5, atol=1e-6, what=f"{where}: o")
        assert_close(levels.double(), cache.levels.double(), rtol=1e-5, atol=1e-6, what=f"{where}: levels")
        assert torch.equal(position, cache.position)


def test_kernel_step_equals_the_tensor_step_from_the_first_token():
    """Positions 0..8: every carry of the first levels, one head of q, k shared by all (Mamba-2's B, C)."""
    check_steps(FenwickCache.empty(2, 2, 5, 6, max_len=16, device=DEVICE), 9, block_v=4, what="from 0", Hk=1)


@pytest.mark.parametrize("decay", [True, False])
def test_kernel_step_at_different_positions_and_long_carries(decay):
    """One batch at positions 63 and 100 of 128 (7 slots): the carry of token 63 fills level 7; per-head q, k."""
    cache = prepared_cache(2, 2, 5, 6, max_len=128, positions=[63, 100], seed=3)
    check_steps(cache, 3, block_v=16, what=f"positions 63, 100, decay={decay}", Hk=2, decay=decay)


def test_kernel_step_stays_inside_its_tensors():
    """Every tensor a view into a NaN-padded buffer: a read outside brings NaN in, a write outside
    overwrites a NaN of the pad."""
    cache = prepared_cache(2, 3, 5, 6, max_len=32, positions=[7, 16], seed=4)
    gen = torch.Generator().manual_seed(5)
    inputs = random_step(gen, 2, 3, 1, 5, 6, cache.num_levels)
    buffers, views = zip(*(padded_copy(x) for x in [cache.levels, *inputs]))
    levels, q, k, v, lam, g = views
    position = cache.position.clone()
    got = decode.decode_step_(levels, position, q, k, v, lam, g, schedule="loop", block_v=4)
    expected = cache.step(inputs[0].expand(2, 3, 5), inputs[1].expand(2, 3, 5), *inputs[2:])
    assert all(guard_intact(b) for b in buffers)
    assert torch.isfinite(got).all() and torch.isfinite(levels).all()
    assert_close(got.double(), expected.double(), rtol=1e-5, atol=1e-6, what="guarded o")
    assert_close(levels.double(), cache.levels.double(), rtol=1e-5, atol=1e-6, what="guarded levels")


def test_kernel_refuses_what_it_does_not_compute():
    cache = FenwickCache.empty(1, 1, 4, 4, max_len=8, device=DEVICE)
    q, k, v, lam, g = random_step(torch.Generator().manual_seed(0), 1, 1, 1, 4, 4, cache.num_levels)
    with pytest.raises(ValueError, match="levels must be float32"):
        decode.decode_step_(cache.levels.double(), cache.position, q, k, v, lam, g)
    with pytest.raises(ValueError, match=r"q, k must have shape \[B=1, H=1 or 1, K=4\]"):
        decode.decode_step_(cache.levels, cache.position, q[..., :3], k, v, lam, g)
    with pytest.raises(ValueError, match=r"level_scales \[B, H, >= 4\]"):
        decode.decode_step_(cache.levels, cache.position, q, k, v, lam[..., :2], g)


VARIANTS = {"unrolled": ("unrolled", False), "lazy": ("loop", True), "lazy_unrolled": ("unrolled", True),
            "split": ("split", False), "lazy_split": ("split", True)}
"""The variants of the kernel: ``name -> (schedule, lazy layout)``."""

SMALL_SLICE = 4
"""Key rows of the split schedule's programs in some tests of every variant: K = 5 in two slices, the second of one
row (the tests of the split schedule alone take more slices)."""


def slice_rows(schedule, block_k):
    """The keyword of the split schedule's key rows: ``block_k`` for it (none for its default: ``None``), none for
    the other schedules."""
    return {"block_k": block_k} if schedule == "split" and block_k is not None else {}


def prepared_layouts(H, K, V, max_len, positions, seed):
    """float64 caches of both layouts whose sequences sit at ``positions``, stepped by the tensor step with the
    same random tokens (per-head q, k, with decay); the lazy one's empty levels hold NaN, which no step reads."""
    gen = torch.Generator().manual_seed(seed)
    eager, lazy = [], []
    for position in positions:
        eager.append(FenwickCache.empty(1, H, K, V, max_len, dtype=torch.float64, device=DEVICE))
        lazy.append(FenwickCache.empty(1, H, K, V, max_len, dtype=torch.float64, device=DEVICE, lazy=True))
        for _ in range(position):
            step = random_step(gen, 1, H, H, K, V, eager[-1].num_levels, dtype=torch.float64)
            eager[-1].step(*step)
            lazy[-1].step(*step)

    def joined(caches, field):
        return torch.cat([getattr(c, field) for c in caches])

    eager = FenwickCache(joined(eager, "levels"), joined(eager, "position"), max_len)
    lazy = FenwickCache(joined(lazy, "levels"), joined(lazy, "position"), max_len, joined(lazy, "decay_scales"))
    lazy.levels[~lazy.live()[:, None, :, None, None].expand_as(lazy.levels)] = float("nan")
    return eager, lazy


def fp32(cache):
    """A float32 copy of a cache, in its layout."""
    scales = None if cache.decay_scales is None else cache.decay_scales.float()
    return FenwickCache(cache.levels.float(), cache.position.clone(), cache.max_len, scales)


def check_variant(name, eager, lazy, steps, block_v, Hk, decay, block_k=None):
    """``steps`` tokens through the variant ``name``, the loop kernel and the float64 tensor step of the
    variant's layout, side by side: outputs, level values, positions; for the lazy layout also the scales,
    and every stored tile but the carry's target left as it was. ``block_k``: the key rows of the
    split schedule's programs (``None``: its default)."""
    schedule, is_lazy = VARIANTS[name]
    exact = lazy if is_lazy else eager
    baseline, fast = fp32(eager), fp32(exact)
    gen = torch.Generator().manual_seed(11)
    B, H, L, K, V = eager.levels.shape
    for i in range(steps):
        q, k, v, lam, g = random_step(gen, B, H, Hk, K, V, L + 1, decay)
        where = f"{name}, step {i} at positions {fast.position.tolist()}"
        into, _ = carry_masks(fast.position, L)
        written = into[:, None, :, None, None].expand_as(fast.levels)
        stored_before = fast.levels.clone()
        expected = exact.step(*(x.double().expand(B, H, K) for x in (q, k)), *(None if x is None else x.double()
                                                                             for x in (v, lam, g)))
        wanted = decode.decode_step_(baseline.levels, baseline.position, q, k, v, lam, g, schedule="loop",
                                     block_v=block_v)
        got = decode.decode_step_(fast.levels, fast.position, q, k, v, lam, g, decay_scales=fast.decay_scales,
                                  schedule=schedule, block_v=block_v, **slice_rows(schedule, block_k))
        assert_close(got.double(), wanted.double(), rtol=1e-5, atol=1e-6, what=f"{where}: o against the loop kernel")
        assert_close(got.double(), expected, rtol=1e-5, atol=1e-6, what=f"{where}: o against float64")
        assert_close(fast.level_values().double(), baseline.levels.double(), rtol=1e-5, atol=1e-6,
                     what=f"{where}: level values against the loop kernel")
        assert_close(fast.level_values().double(), exact.level_values(), rtol=1e-5, atol=1e-6,
                     what=f"{where}: level values against float64")
        assert torch.equal(fast.position, baseline.position) and torch.equal(fast.position, exact.position)
        if is_lazy:
            assert_close(fast.decay_scales.double(), exact.decay_scales, rtol=1e-6, what=f"{where}: scales")
            torch.testing.assert_close(fast.levels[~written], stored_before[~written], rtol=0, atol=0, equal_nan=True,
                                       msg=f"{where}: a tile other than the carry's target changed")


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_equals_the_loop_kernel_at_many_positions(name):
    """One batch at 0, 1, powers of two and their neighbours up to 33 and two random positions (6 slots), q, k
    shared by the heads, with decay: three consecutive tokens."""
    positions = [0, 1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33]
    positions += torch.randint(0, 63, (2,), generator=torch.Generator().manual_seed(2)).tolist()
    eager, lazy = prepared_layouts(2, 5, 6, 64, positions, seed=3)
    check_variant(name, eager, lazy, steps=3, block_v=8, Hk=1, decay=True)


@pytest.mark.parametrize("decay", [True, False], ids=["decay", "no_decay"])
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_equals_the_loop_kernel_from_the_first_token(name, decay):
    """Two sequences from positions 0 and 5, eight tokens (every carry into levels 1 to 4), per-head q, k, the
    value columns split over two programs (and the key rows over two, for the split schedule)."""
    eager, lazy = prepared_layouts(2, 5, 6, 16, [0, 5], seed=4)
    check_variant(name, eager, lazy, steps=8, block_v=4, Hk=2, decay=decay, block_k=SMALL_SLICE)


@pytest.mark.parametrize("name", ["loop", *VARIANTS])
def test_step_without_advance_updates_the_state_and_keeps_the_position(name):
    """``advance=False`` (the benchmark repeats one position with it): the same output and the same levels as the
    step that advances, the position left as it was."""
    schedule, is_lazy = ("loop", False) if name == "loop" else VARIANTS[name]
    eager, lazy = prepared_layouts(2, 5, 6, 16, [3, 6], seed=9)
    advanced, kept = fp32(lazy if is_lazy else eager), fp32(lazy if is_lazy else eager)
    q, k, v, lam, g = random_step(torch.Generator().manual_seed(12), 2, 2, 2, 5, 6, advanced.num_levels)
    outputs = [decode.decode_step_(c.levels, c.position, q, k, v, lam, g, decay_scales=c.decay_scales, schedule=schedule,
                                   block_v=4, advance=advance) for c, advance in ((advanced, True), (kept, False))]
    assert kept.position.tolist() == [3, 6] and advanced.position.tolist() == [4, 7]
    assert torch.equal(outputs[0], outputs[1])
    assert torch.equal(advanced.levels.nan_to_num(), kept.levels.nan_to_num())  # stored tiles (the lazy layout's
    assert advanced.decay_scales is None or torch.equal(advanced.decay_scales, kept.decay_scales)  # dead ones: NaN)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_stays_inside_its_tensors(name):
    """As :func:`test_kernel_step_stays_inside_its_tensors`, for each variant (the lazy scales padded too)."""
    schedule, is_lazy = VARIANTS[name]
    eager, lazy = prepared_layouts(3, 5, 6, 32, [7, 16], seed=5)
    exact = lazy if is_lazy else eager
    inputs = random_step(torch.Generator().manual_seed(6), 2, 3, 1, 5, 6, exact.num_levels)
    tensors = [exact.levels.float()] + ([exact.decay_scales.float()] if is_lazy else []) + inputs
    buffers, views = zip(*(padded_copy(x) for x in tensors))
    levels, scales = views[0], views[1] if is_lazy else None
    q, k, v, lam, g = views[-5:]
    position = exact.position.clone()
    got = decode.decode_step_(levels, position, q, k, v, lam, g, decay_scales=scales, schedule=schedule, block_v=4,
                              **slice_rows(schedule, SMALL_SLICE))
    expected = exact.step(inputs[0].double().expand(2, 3, 5), inputs[1].double().expand(2, 3, 5),
                          *(x.double() for x in inputs[2:]))
    assert all(guard_intact(b) for b in buffers)
    assert torch.isfinite(got).all()
    assert_close(got.double(), expected, rtol=1e-5, atol=1e-6, what=f"{name}: guarded o")
    values = FenwickCache(levels, position, 32, scales).level_values()
    assert_close(values.double(), exact.level_values(), rtol=1e-5, atol=1e-6, what=f"{name}: guarded levels")


def test_variants_refuse_what_they_do_not_compute():
    cache = FenwickCache.empty(1, 2, 4, 4, max_len=8, device=DEVICE, lazy=True)
    q, k, v, lam, g = random_step(torch.Generator().manual_seed(0), 1, 2, 1, 4, 4, cache.num_levels)
    with pytest.raises(ValueError, match=r"schedule must be one of \('loop', 'unrolled', 'split'\), got 'tiled'"):
        decode.decode_step_(cache.levels, cache.position, q, k, v, lam, g, schedule="tiled")
    with pytest.raises(ValueError, match=r"decay_scales must be float32 \[B=1, H=2, L=3, V=4\]"):
        decode.decode_step_(cache.levels, cache.position, q, k, v, lam, g, decay_scales=cache.decay_scales[:, :, :2])
    with pytest.raises(ValueError, match="got torch.float64"):
        decode.decode_step_(cache.levels, cache.position, q, k, v, lam, g, decay_scales=cache.decay_scales.double())


@pytest.mark.parametrize("name, block_k, block_v", [("split", 8, 32), ("lazy_split", 8, 16)],
                         ids=["eager-5x1", "lazy-5x2"])
def test_split_equals_the_loop_schedule_token_after_token_from_the_first(name, block_k, block_v):
    """One sequence, K = 40 and V = 24 (neither a multiple of the tiles: the last key slice and value block are
    partial), an odd number of key slices: the 16 tokens from position 0 to the buffer's end, through every
    carry into levels 1 to 4 and the last token's, into level 5, which has no slot (the buffer ends empty), against
    the loop kernel and the float64 tensor step."""
    eager, lazy = prepared_layouts(1, 40, 24, 16, [0], seed=7)
    check_variant(name, eager, lazy, steps=16, block_v=block_v, Hk=1, decay=True, block_k=block_k)


@pytest.mark.parametrize("name", ["split", "lazy_split"])
def test_split_equals_the_loop_schedule_for_a_batch_at_different_positions(name):
    """Three sequences at positions 6, 14 and 31 (carries into levels 4, 5 and 6 among the three tokens), K = 40
    in three key slices, V = 24 in three value blocks: nine programs a head."""
    eager, lazy = prepared_layouts(1, 40, 24, 64, [6, 14, 31], seed=8)
    check_variant(name, eager, lazy, steps=3, block_v=8, Hk=1, decay=True, block_k=16)


def test_split_refuses_bad_slices():
    cache = FenwickCache.empty(1, 2, 40, 24, max_len=8, device=DEVICE, lazy=True)
    q, k, v, lam, g = random_step(torch.Generator().manual_seed(0), 1, 2, 1, 40, 24, cache.num_levels)
    for bad in (24, 0, -8, 256, 16.0, True):
        with pytest.raises(ValueError, match=re.escape(f"block_k must be a power of two from 1 to 128, got {bad!r}")):
            decode.decode_step_(cache.levels, cache.position, q, k, v, lam, g, decay_scales=cache.decay_scales,
                                schedule="split", block_k=bad)
    with pytest.raises(ValueError, match=r"block_k sets the 'split' schedule's key slices, got block_k=16 with 'loop'"):
        decode.decode_step_(cache.levels, cache.position, q, k, v, lam, g, schedule="loop", block_k=16)
    too_many = r"a value column of its own: at most V=24, got 60 \(K=40, block_k=2, block_v=8\)"
    with pytest.raises(ValueError, match=too_many):
        decode.decode_step_(cache.levels, cache.position, q, k, v, lam, g, decay_scales=cache.decay_scales,
                            schedule="split", block_k=2, block_v=8)
    assert cache.position.item() == 0 and not cache.decay_scales.any()  # nothing ran


def test_split_defaults_give_every_program_of_a_head_a_value_column():
    assert decode.default_block_v("split", 21, 64) == 16 and decode.default_block_k(128, 64, 16, lazy=True) == 32
    assert decode.split_programs(128, 64, 32, 16) == 16 and decode.split_programs(40, 24, 16, 8) == 9
    assert decode.default_block_k(5, 6, 4, lazy=False) == 16  # block(5): one slice
    assert decode.default_block_k(128, 4, 1, lazy=False) == 32  # the eager layout has no scales to own
    assert decode.default_block_k(128, 4, 1, lazy=True) == 128  # 4 value columns: one slice of 4 programs
    for K, V, block_v in [(128, 64, 8), (128, 64, 64), (40, 24, 8), (128, 2, 1), (7, 1, 1)]:
        assert decode.split_programs(K, V, decode.default_block_k(K, V, block_v, lazy=True), block_v) <= V


def test_default_schedule_and_tile_follow_the_batch_and_the_levels():
    assert decode.default_schedule(1, 48) == "unrolled" and decode.default_schedule(2, 48) == "loop"
    assert decode.default_schedule(decode.UNROLLED_UP_TO, 1) == "unrolled"
    assert decode.default_block_v("loop", 21, 64) == 32 and decode.default_block_v("loop", 21, 8) == 16
    assert decode.default_block_v("unrolled", 14, 64) == 16 and decode.default_block_v("unrolled", 15, 64) == 8


@pytest.mark.parametrize("batch, heads", [(1, 2), (33, 2)])
def test_default_launch_equals_the_loop_kernel(batch, heads):
    """``schedule=None``: the unrolled schedule for a few (sequence, head) pairs, the loop for many; lazy layout."""
    assert decode.default_schedule(batch, heads) == ("unrolled" if batch * heads <= decode.UNROLLED_UP_TO else "loop")
    gen = torch.Generator().manual_seed(5)
    K, V, max_len = 8, 16, 64
    exact = FenwickCache.empty(batch, heads, K, V, max_len, dtype=torch.float64, device=DEVICE, lazy=True)
    exact.position.fill_(45)
    live = exact.live()[0]
    exact.levels[:, :, live] = torch.randn(batch, heads, int(live.sum()), K, V, generator=gen,
                                           dtype=torch.float64).to(DEVICE)
    exact.decay_scales[:, :, live] = (0.5 + 0.5 * torch.rand(batch, heads, int(live.sum()), 1, generator=gen,
                                                             dtype=torch.float64)).to(DEVICE)
    fast = FenwickCache(exact.levels.float(), exact.position.clone(), max_len, exact.decay_scales.float())
    for i in range(3):
        q, k, v, lam, g = random_step(gen, batch, heads, heads, K, V, exact.num_levels, True)
        expected = exact.step(q.double(), k.double(), v.double(), lam.double(), g.double())
        got = decode.decode_step_(fast.levels, fast.position, q, k, v, lam, g, decay_scales=fast.decay_scales)
        assert_close(got.double(), expected, rtol=1e-5, atol=1e-6, what=f"step {i}: o")
        assert_close((fast.decay_scales[..., None, :] * fast.levels).double()[:, :, fast.live()[0]],
                     (exact.decay_scales[..., None, :] * exact.levels)[:, :, exact.live()[0]], rtol=1e-5, atol=1e-6,
                     what=f"step {i}: level values")


def test_step_bytes_count_the_tiles_each_layout_moves():
    """Eager: the live slots read, and written back with the carry's target; lazy: the live slots read, the target
    written, and the scales of the slots live before or after. Counted from the masks of :mod:`loglin_edu.decoding`
    at every position a buffer of 11 slots steps from, and at the first and last of one of 20 (a target past the
    buffer is not written)."""
    K, V = 128, 64
    tile, row = K * V * 4, V * 4
    for levels in (11, 20):
        positions = torch.cat([torch.arange(0, 2000), torch.arange(2**levels - 48, 2**levels)])
        live, (into, _) = live_levels(positions, levels), carry_masks(positions, levels)
        counts = zip(positions.tolist(), live.sum(1).tolist(), into.sum(1).tolist(), (live | into).sum(1).tolist())
        for t, read, target, written in counts:
            assert decode.step_bytes(t, K, V, levels=levels) == (read + written) * tile, (levels, t)
            assert decode.step_bytes(t, K, V, lazy=True, levels=levels) == (read + target) * tile + (read + written) * row
    assert decode.step_bytes(0, K, V) == tile and decode.step_bytes(0, K, V, lazy=True) == tile + row
    assert decode.step_bytes(1023, K, V) == 21 * tile  # p = popcount(1023) = 10 read, 11 written
    assert decode.step_bytes(1023, K, V, lazy=True) == 11 * tile + 21 * row
    assert decode.step_bytes(2**20 - 1, K, V, levels=20) == 40 * tile  # the last token of 2^20: no target
    assert decode.step_bytes(2**20 - 1, K, V, lazy=True, levels=20) == 20 * tile + 40 * row


@pytest.mark.gpu
def test_kernel_step_with_bf16_inputs_against_float64():
    """bf16 q, k, v, λ, g into fp32 levels: within 1e-2 of the float64 tensor step after 300 tokens."""
    gen = torch.Generator().manual_seed(6)
    B, H, K, V = 4, 8, 128, 64
    exact = FenwickCache.empty(B, H, K, V, max_len=512, dtype=torch.float64, device=DEVICE)
    fast = FenwickCache.empty(B, H, K, V, max_len=512, device=DEVICE)
    for _ in range(300):
        q, k, v, lam, g = random_step(gen, B, H, 1, K, V, exact.num_levels, dtype=torch.bfloat16)
        expected = exact.step(*(x.double().expand(B, H, -1) if x.dim() == 3 and x.shape[1] == 1 else x.double()
                                for x in (q, k, v, lam)), g.double())
        got = decode.decode_step_(fast.levels, fast.position, q, k, v, lam, g)
    assert_close(got.double(), expected, rtol=1e-2, what="bf16 decode step")


@pytest.mark.gpu
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_with_bf16_inputs_against_float64(name):
    """As :func:`test_kernel_step_with_bf16_inputs_against_float64`, for each variant (compiled at K = 128,
    V = 64, 9 slots)."""
    schedule, lazy = VARIANTS[name]
    gen = torch.Generator().manual_seed(6)
    B, H, K, V = 4, 8, 128, 64
    exact = FenwickCache.empty(B, H, K, V, max_len=512, dtype=torch.float64, device=DEVICE)
    fast = FenwickCache.empty(B, H, K, V, max_len=512, device=DEVICE, lazy=lazy)
    for _ in range(300):
        q, k, v, lam, g = random_step(gen, B, H, 1, K, V, exact.num_levels, dtype=torch.bfloat16)
        expected = exact.step(q.double().expand(B, H, K), k.double().expand(B, H, K), v.double(), lam.double(),
                              g.double())
        got = decode.decode_step_(fast.levels, fast.position, q, k, v, lam, g, decay_scales=fast.decay_scales,
                                  schedule=schedule)
    assert_close(got.double(), expected, rtol=1e-2, what=f"{name}: bf16 decode step")
    assert_close(fast.level_values().double(), exact.levels, rtol=1e-2, what=f"{name}: levels after 300 tokens")


@pytest.mark.gpu
@pytest.mark.parametrize("block_v", [8, 16, 32, 64])
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_at_a_million_tokens_equals_the_loop_kernel(name, block_v):
    """The benchmark's fullest state, position 2^20 - 1 (20 slots, all live) at K = 128, V = 64, every V-tile it
    times (the unrolled schedule's registers spill at the wide ones): two steps against the loop kernel, the last
    one the buffer's last token (its carry has no slot: every level ends empty)."""
    schedule, lazy = VARIANTS[name]
    gen = torch.Generator().manual_seed(7)
    B, H, K, V, T = 2, 4, 128, 64, 2**20
    baseline = FenwickCache.empty(B, H, K, V, max_len=T, device=DEVICE)
    fast = FenwickCache.empty(B, H, K, V, max_len=T, device=DEVICE, lazy=lazy)
    for cache in (baseline, fast):
        cache.position.fill_(T - 2)
    live = baseline.live()[0]
    stored = 0.01 * torch.randn(B, H, int(live.sum()), K, V, generator=gen).to(DEVICE)
    scales = (0.5 + 0.5 * torch.rand(B, H, int(live.sum()), 1, 1, generator=gen)).to(DEVICE)
    fast.levels[:, :, live] = stored if lazy else scales * stored
    baseline.levels[:, :, live] = scales * stored
    if lazy:
        fast.decay_scales[:, :, live] = scales[..., 0].expand(-1, -1, -1, V)
    for i in range(2):  # tokens T - 2 (a carry into level 1) and T - 1 (into level 21, past the buffer)
        q, k, v, lam, g = random_step(gen, B, H, 1, K, V, baseline.num_levels)
        wanted = decode.decode_step_(baseline.levels, baseline.position, q, k, v, lam, g, schedule="loop",
                                     block_v=block_v)
        got = decode.decode_step_(fast.levels, fast.position, q, k, v, lam, g, decay_scales=fast.decay_scales,
                                  schedule=schedule, block_v=block_v)
        assert_close(got.double(), wanted.double(), rtol=1e-5, what=f"{name}, BV={block_v}, step {i}: o")
        assert_close(fast.level_values().double(), baseline.levels.double(), rtol=1e-5,
                     what=f"{name}, BV={block_v}, step {i}: levels")
    assert not fast.live().any() and not fast.level_values().any() and not baseline.levels.any()


@pytest.mark.gpu
@pytest.mark.parametrize("block_k, block_v", [(16, 8), (32, 16), (64, 16), (32, 64)])
@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_split_equals_the_loop_schedule_token_after_token_on_the_gpu(lazy, block_k, block_v):
    """One sequence, 48 heads, K = 128, V = 64: up to 64 programs a head, run at once and in no order. 600 tokens from
    position 0 against the loop schedule in the same layout, every output and the levels; on the lazy layout
    every scale equal bit for bit after every token: a program that read a scale another program of its head had
    already rewritten would decay its level twice (the interpreter runs programs one after another, so only here
    could such a race show)."""
    gen = torch.Generator().manual_seed(9)
    B, H, K, V, T = 1, 48, 128, 64, 1024
    baseline = FenwickCache.empty(B, H, K, V, max_len=T, device=DEVICE, lazy=lazy)
    fast = FenwickCache.empty(B, H, K, V, max_len=T, device=DEVICE, lazy=lazy)
    for i in range(600):
        q, k, v, lam, g = random_step(gen, B, H, 1, K, V, baseline.num_levels)
        wanted = decode.decode_step_(baseline.levels, baseline.position, q, k, v, lam, g,
                                     decay_scales=baseline.decay_scales, schedule="loop")
        got = decode.decode_step_(fast.levels, fast.position, q, k, v, lam, g, decay_scales=fast.decay_scales,
                                  schedule="split", block_k=block_k, block_v=block_v)
        where = f"BK={block_k}, BV={block_v}, token {i}"
        assert_close(got.double(), wanted.double(), rtol=1e-5, atol=1e-6, what=f"{where}: o")
        assert torch.equal(fast.position, baseline.position), where
        if lazy:
            assert torch.equal(fast.decay_scales, baseline.decay_scales), f"{where}: scales"
        if i % 50 == 49:
            assert_close(fast.level_values().double(), baseline.level_values().double(), rtol=1e-5, atol=1e-6,
                         what=f"{where}: levels")


@pytest.mark.gpu
def test_split_step_replays_from_a_cuda_graph():
    """The split schedule's two launches captured once in a CUDA graph (on the lazy layout, the position advanced by
    the second launch), replayed token after token with new inputs copied in: the outputs, levels and positions of
    the loop schedule's steps."""
    gen = torch.Generator().manual_seed(10)
    B, H, K, V, T = 1, 48, 128, 64, 256
    fast = FenwickCache.empty(B, H, K, V, max_len=T, device=DEVICE, lazy=True)
    baseline = FenwickCache.empty(B, H, K, V, max_len=T, device=DEVICE, lazy=True)
    inputs = random_step(gen, B, H, 1, K, V, fast.num_levels)

    def step():
        return decode.decode_step_(fast.levels, fast.position, *inputs, decay_scales=fast.decay_scales,
                                   schedule="split")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiles the kernels outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = step()
    for state in (fast.levels, fast.decay_scales, fast.position):  # back to position 0 after the warm-up step
        state.zero_()
    for i in range(200):
        new = random_step(gen, B, H, 1, K, V, fast.num_levels)
        for held, x in zip(inputs, new):
            held.copy_(x)
        graph.replay()
        wanted = decode.decode_step_(baseline.levels, baseline.position, *new, decay_scales=baseline.decay_scales,
                                     schedule="loop")
        assert_close(o.double(), wanted.double(), rtol=1e-5, atol=1e-6, what=f"token {i}: o")
    assert torch.equal(fast.position, baseline.position)
    assert_close(fast.level_values().double(), baseline.level_values().double(), rtol=1e-5, atol=1e-6, what="levels")


def test_layer_decodes_with_the_kernel():
    """LogLinearMamba2(backend="triton"): prefill by the Triton form, steps by the decode kernel, in fp32,
    equal to the layer's float64 forward."""
    from loglin_edu.layers import LogLinearMamba2

    torch.manual_seed(0)
    layer = LogLinearMamba2(16, d_state=8, head_dim=8, max_len=32, backend="triton", chunk_size=16).to(DEVICE)
    x = torch.randn(2, 21, 16, device=DEVICE)
    layer.backend = "torch"
    full = layer.double()(x.double())
    layer.float()
    layer.backend = "triton"
    head, cache = layer.prefill(x[:, :17], max_len=32)
    tail = torch.stack([layer.step(x[:, t], cache) for t in range(17, 21)], dim=1)
    assert cache.levels.position.tolist() == [21, 21]
    assert_close(torch.cat([head, tail], dim=1).double(), full, rtol=1e-5, what="triton prefill + kernel steps")


def test_mamba2_kernel_step_equals_the_recurrence():
    """The baseline of the decode benchmark: Mamba-2's one-state step, against the package's recurrence."""
    from loglin_edu.recurrence import read, transition, write

    gen = torch.Generator().manual_seed(8)
    B, H, K, V = 2, 3, 5, 6
    state = torch.zeros(B, H, K, V, device=DEVICE)
    reference = state.double()
    for _ in range(4):
        q, k, v, _, g = random_step(gen, B, H, 1, K, V, 1)
        got = decode.mamba2_decode_step_(state, q, k, v, g, block_v=4)
        k_h = k.double().expand(B, H, K)
        reference = transition(reference, k_h, g.double(), None) + write(k_h, v.double(), None)
        assert_close(got.double(), read(reference, q.double().expand(B, H, K)), rtol=1e-5, atol=1e-6, what="o")
        assert_close(state.double(), reference, rtol=1e-5, atol=1e-6, what="state")


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
def test_prefill_then_decode_against_the_fp32_forward(dtype):
    """The Triton prefill of the first tokens, then the decode kernel token by token, in ``dtype`` (bf16 on a
    GPU only: the interpreter's bf16 dots are wrong), within the dtype's bound of the fp32 chunkwise forward."""
    import loglin_edu as le

    on_gpu = DEVICE == "cuda"
    B, T, t0, H, K, V = (2, 1000, 700, 4, 128, 64) if on_gpu else (1, 90, 70, 2, 16, 16)
    gen = torch.Generator().manual_seed(8)
    inputs = [torch.randn(B, T, 1, K, generator=gen) * K**-0.5, torch.randn(B, T, 1, K, generator=gen) * K**-0.5,
              torch.randn(B, T, H, V, generator=gen), 0.5 + torch.rand(B, T, H, le.num_levels(T), generator=gen),
              -0.1 * torch.rand(B, T, H, generator=gen)]
    full = le.loglinear_attention(*(x.to(DEVICE) for x in inputs), form="chunkwise", chunk_size=16)
    q, k, v, lam, g = (x.to(DEVICE, dtype) for x in inputs)
    head, state = le.loglinear_attention(q[:, :t0], k[:, :t0], v[:, :t0], lam[:, :t0], g[:, :t0], form="triton",
                                         chunk_size=16, return_state=True)
    cache = FenwickCache.from_state(state, max_len=T, dtype=torch.float32)
    tail = [decode.decode_step_(cache.levels, cache.position, q[:, t], k[:, t], v[:, t], lam[:, t], g[:, t])
            for t in range(t0, T)]
    got = torch.cat([head, torch.stack(tail, dim=1)], dim=1)
    bound = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert_close(got.double(), full.double(), rtol=bound, what=f"{dtype} prefill {t0} + decode {T - t0}")
