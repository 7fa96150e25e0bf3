"""One decoding step of log-linear Mamba-2 for a batch, in one launch (or two): decay, read and carry.

The state is the :class:`~loglin_edu.decoding.FenwickCache` buffer ``levels: [B, H, L, K, V]`` (fp32), slot
``i`` holding level ``i + 1`` of the next query, live iff bit ``i`` of the position is set, with ``position: [B]``
the tokens each sequence has consumed. For the token at position ``t``, with ``low = (t + 1) & -(t + 1)``
(``2^j``), slot by slot (PAPER.md §2):

    S^(l) <- exp(g) S^(l);      o = λ_0 (q·k) v + Σ_{l >= 1} λ_l S^(l)ᵀ q
    S^(l) <- k vᵀ + Σ_{m < l} S^(m)  if l = j + 1  (low >> (l-1) = 1),
             0                       if l <= j     (low >> (l-1) > 1),          the binary-counter carry
             S^(l)                   otherwise

Level 0, the token's own ``k vᵀ``, is read as a tile like the others but never stored. One program owns one
``(batch, head, V-block)`` and visits the ``L`` slots once, keeping the running sum ``Σ_{m < l} S^(m)`` of the
carry in registers: every slot is read at most once and written at most once. A slot empty before the step is
not read (its load is masked off: it holds zeros), and one empty before and after is not written. With
``p = popcount(t)`` a step reads the ``p`` live slots and writes them back (decayed, or zeros where the carry
empties them) and the carry's target: ``(2p + 1) · K · V · 4`` bytes per head, the floor for levels rewritten to
decay every token. The step is memory-bound: ``2 · L · K · V`` flops per head against those bytes. When the
target lies past the buffer (the last token of a power-of-two ``max_len``; :mod:`loglin_edu.decoding`) no slot
receives it.

Three schedules of the levels (``schedule=``; by default :func:`default_schedule` of the batch):

- ``"loop"``: a runtime loop over the slots (``L`` a runtime argument, one compilation serves every
  depth). Each slot's load is issued after the previous slot's store, so a step waits for about ``L``
  memory round trips one after another.
- ``"unrolled"``: ``L`` a compile-time constant (one compilation per level count). The program issues the
  loads of all ``L`` slots (and their ``λ``) before it uses the first, then decays, reads and carries from
  registers: one round trip for the levels. It holds ``L`` tiles of ``K × BV`` at once, so it takes more warps
  (:func:`default_num_warps`). Its output sums the ``λ``-weighted tiles first and reduces over ``K`` once.
- ``"split"``: the unrolled schedule on a slice of the key rows. At a small batch the step is few programs, each
  waiting on its loads; but every part of a level's update (the decay, the carry's sum, the write of ``k vᵀ``)
  acts row by row in ``K``, so the rows split into ``NK = K / BK`` independent slices (``block_k = BK`` rows
  each) and the grid into ``NK · V / BV`` programs per head, each holding ``L`` tiles of ``BK × BV``. Only the
  read sums over ``K``: program ``(i_k, i_v)`` writes its slice's part of it,

      partial[i_k] = Σ_{k in slice i_k} q_k (Σ_l λ_l S^(l))_k        partial: [NK, B, H, V] fp32,

  and a second launch sums the parts in slice order (the same result at every run) into ``o`` and advances the
  position: two launches, as the other schedules' kernel and ``position.add_(1)``. One kernel per layout serves
  the ``"unrolled"`` and ``"split"`` schedules, a compile-time flag choosing the program's rows and where its
  output goes: the unrolled schedule is the split one with a single slice, its output stored whole.

Two layouts (``decay_scales=``): the eager one above, and the lazy one of
:class:`~loglin_edu.decoding.FenwickCache` (a level's value ``c^(l) stored^(l)``, its scale repeated in
every value column of ``decay_scales: [B, H, L, V]``): the step multiplies every scale by ``exp(g)``, reads
the live levels, and writes only the tile that changes — the carry's target (``k vᵀ + Σ_{m <= j} c^(m)
stored^(m)``, scale 1); the levels it empties get scale 0 and keep their tiles. That is ``(p + 1) · K · V · 4``
bytes per head, and ``(2p + 1) · V · 4`` for the scales (:func:`step_bytes`).

The lazy layout and the ``"split"`` schedule: a head's scales are read and rewritten by all its programs, and
programs run in no order, so a program must never read a scale another has already rewritten (it would decay
its level twice). The value columns give each program a copy of its own: with ``P = NK · V / BV <= V``
programs per head, numbered ``i_kv``, program ``i_kv`` reads every level's old scale from column ``i_kv`` and
writes the new one into the columns ``c ≡ i_kv (mod P)``. Every column has one writer, and column ``i_kv`` is
written by its reader alone, after a barrier that follows every read of its threads: every read sees the old
scale, every column gets the new one, the arithmetic is the other schedules' (the scales agree bit for bit),
and the layout is unchanged. A step with more programs per head than value columns is refused
(:func:`check_block_k`; :func:`default_block_k` never picks one). Other ways out cost more: scales kept twice,
read from the copy of the position's parity and written to the other (a second buffer, a new layout), or the
split for the eager layout only (every live level rewritten each token).

:func:`mamba2_decode_step_` is the same step for Mamba-2's single state (``S <- exp(g) S + k vᵀ``,
``o = Sᵀ q``): one state in, one out — the baseline a log-linear step is measured against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import MAX_BLOCK, block
from .inputs import last_dim_contiguous, same_strides


@triton.jit
def load_token(q_ptr, k_ptr, v_ptr, i_b, i_h, sqb, sqh, svb, svh, rk, rv, K, V):
    """The token's q, k ``[BK]`` and v ``[BV]`` for batch ``i_b`` and head ``i_h``, in fp32, zero past ``K`` and
    ``V`` (q and k share their strides)."""
    q = tl.load(q_ptr + i_b.to(tl.int64) * sqb + i_h * sqh + rk, mask=rk < K, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + i_b.to(tl.int64) * sqb + i_h * sqh + rk, mask=rk < K, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + i_b.to(tl.int64) * svb + i_h * svh + rv, mask=rv < V, other=0.0).to(tl.float32)
    return q, k, v


@triton.jit
def token_decay(g_ptr, i_b, i_h, sgb, sgh, HAS_DECAY: tl.constexpr):
    """``exp(g)`` of batch ``i_b`` and head ``i_h`` in fp32 (1 without decay)."""
    decay = 1.0
    if HAS_DECAY:
        decay = tl.exp(tl.load(g_ptr + i_b.to(tl.int64) * sgb + i_h * sgh).to(tl.float32))
    return decay


@triton.jit
def level_flags(t, slot):
    """Slot ``slot`` (level ``slot + 1``) in the step of the token at position ``t`` (int64 scalars, ``slot`` a
    tensor so that its comparisons stay booleans in the interpreter too): ``(live, into, cleared)`` — the slot
    holds keys before the step (bit ``slot`` of ``t``), receives the carry (``2^slot = low``), is emptied by it
    (``2^slot < low``), with ``low = (t + 1) & -(t + 1)``."""
    low = (t + 1) & (-(t + 1))  # 2^j
    live = ((t >> slot) & 1) == 1
    into = (low >> slot) == 1
    cleared = (low >> slot) > 1
    return live, into, cleared


@triton.jit
def tile_mask(rk, rv, rows_on, K, V):
    """A level tile's mask ``[BK, BV]``: the rows below ``K`` when ``rows_on`` (a scalar), none otherwise (a
    compare of full shape), and the columns below ``V``."""
    return (rk[:, None] < tl.where(rows_on, K, 0)) & (rv[None, :] < V)


@triton.jit
def eager_level(state, carried, written, into, cleared, decay):
    """A slot in the step (eager layout), from its tile before (zeros when empty) and the running carry sum
    ``carried = Σ_{m < l} S^(m)`` of the decayed tiles below it: ``(value, state, carried)`` — its decayed value
    (what the read takes), its tile after the carry (``k vᵀ + carried`` at the target, zeros where emptied) and
    the running sum with its value added."""
    value = state * decay
    state = tl.where(into, carried + written, tl.where(cleared, 0.0, value))
    return value, state, carried + value


@triton.jit
def lazy_level(state, scale, carried, written, into, cleared, decay):
    """A slot in the step (lazy layout), from its stored tile and scale (a scalar) before (zeros when empty) and
    the running carry sum ``carried = Σ_{m < l} c^(m) stored^(m)`` of the decayed values below it:
    ``(value, state, scale, carried)`` — its decayed value ``c stored`` (what the read takes), its stored tile
    and scale after the carry (the target stores ``k vᵀ + carried`` with scale 1, an emptied slot keeps its tile
    with scale 0, any other keeps its tile with the decayed scale) and the running sum with its value added."""
    scale = scale * decay
    value = scale * state
    state = tl.where(into, carried + written, state)
    scale = tl.where(into, 1.0, tl.where(cleared, 0.0, scale))
    return value, state, scale, carried + value


@triton.jit
def tile_start(levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V,
               s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh,
               i_v, i_h, i_b, rk, HAS_DECAY: tl.constexpr, BV: tl.constexpr):
    """What the program of value block ``i_v``, head ``i_h``, batch ``i_b`` and key rows ``rk`` starts from: its
    value columns ``rv [BV]``, the sequence's position ``t``, the token's ``q, k`` (at ``rk``) and ``v [BV]`` in
    fp32, ``exp(g)``, its head's levels, the offsets ``[len(rk), BV]`` of its tile in a level, and its head's row
    of ``λ``."""
    rv = i_v * BV + tl.arange(0, BV)
    t = tl.load(position_ptr + i_b).to(tl.int64)
    q, k, v = load_token(q_ptr, k_ptr, v_ptr, i_b, i_h, sqb, sqh, svb, svh, rk, rv, K, V)
    decay = token_decay(g_ptr, i_b, i_h, sgb, sgh, HAS_DECAY)
    base = levels_ptr + i_b.to(tl.int64) * s_lb + i_h.to(tl.int64) * s_lh
    tile = rk[:, None].to(tl.int64) * s_lk + rv[None, :]
    lam_row = lam_ptr + i_b.to(tl.int64) * s_lam_b + i_h * s_lam_h
    return rv, t, q, k, v, decay, base, tile, lam_row


@triton.jit
def program_start(levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V,
                  s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh,
                  HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """What every decode program of grid ``(V / BV, H, B)`` starts from: its block ``(i_v, i_h, i_b)``, key rows
    ``rk [BK]`` (all of them) and what :func:`tile_start` gives."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rk = tl.arange(0, BK)
    rv, t, q, k, v, decay, base, tile, lam_row = tile_start(
        levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V,
        s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, i_v, i_h, i_b, rk, HAS_DECAY, BV)
    return i_v, i_h, i_b, rk, rv, t, q, k, v, decay, base, tile, lam_row


@triton.jit
def store_scale(scale_ptr, scale, rv, V, live, BV: tl.constexpr):
    """A level's scale (a scalar) into the program's ``BV`` columns ``rv`` of its row at ``scale_ptr`` (the
    program's first column), when the level is ``live`` before or after the step."""
    tl.store(scale_ptr + tl.arange(0, BV), scale + tl.zeros((BV,), tl.float32), mask=rv < tl.where(live, V, 0))


@triton.jit
def store_output(o_ptr, out, i_b, i_h, sob, soh, rv, V):
    """The token's output ``out [BV]`` of batch ``i_b`` and head ``i_h`` at columns ``rv``, in o's dtype."""
    tl.store(o_ptr + i_b.to(tl.int64) * sob + i_h * soh + rv, out.to(o_ptr.dtype.element_ty), mask=rv < V)


@triton.jit
def fenwick_decode_kernel(
    levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, o_ptr,
    K, V, L,
    s_lb, s_lh, s_ll, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, sob, soh,
    HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """The ``"loop"`` schedule, eager layout. Grid ``(V / BV, H, B)``. levels: [B, H, L, K, V] (V contiguous);
    q, k: [B, H or 1, K] (head stride 0 when shared); v, o: [B, H, V]; lam: [B, H, >= L + 1] (level 0 first);
    g: [B, H]; position: [B] int64."""
    i_v, i_h, i_b, rk, rv, t, q, k, v, decay, base, tile, lam_row = program_start(
        levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V,
        s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, HAS_DECAY, BK, BV)
    written = k[:, None] * v[None, :]
    carried = tl.zeros((BK, BV), dtype=tl.float32)  # Σ_{m < l} exp(g) S^(m)
    out = tl.load(lam_row).to(tl.float32) * tl.sum(q[:, None] * written, 0)  # level 0: λ_0 (q·k) v
    for i_l in range(L):
        slot = tl.full((), 0, tl.int64) + i_l
        live, into, cleared = level_flags(t, slot)
        ptrs = base + i_l * s_ll + tile
        state = tl.load(ptrs, mask=tile_mask(rk, rv, live, K, V), other=0.0)
        value, state, carried = eager_level(state, carried, written, into, cleared, decay)
        tl.store(ptrs, state, mask=tile_mask(rk, rv, live | into, K, V))
        out += tl.load(lam_row + i_l + 1).to(tl.float32) * tl.sum(q[:, None] * value, 0)
    store_output(o_ptr, out, i_b, i_h, sob, soh, rv, V)


@triton.jit
def lazy_decode_kernel(
    levels_ptr, scales_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, o_ptr,
    K, V, L,
    s_lb, s_lh, s_ll, s_lk, s_cb, s_ch, s_cl, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, sob, soh,
    HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """The ``"loop"`` schedule, lazy layout: arguments as :func:`fenwick_decode_kernel` and scales: [B, H, L, V]
    fp32 (V contiguous), updated in place. A level's scale is the same in every column: a program reads it from
    its first column and writes it to all of its columns, which no other program reads or writes. Every thread of
    the program reads that first column, and some thread writes it in the same iteration: a barrier between the
    read and the write keeps a slow thread from reading the level's new scale."""
    i_v, i_h, i_b, rk, rv, t, q, k, v, decay, base, tile, lam_row = program_start(
        levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V,
        s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, HAS_DECAY, BK, BV)
    written = k[:, None] * v[None, :]
    scale_row = scales_ptr + i_b.to(tl.int64) * s_cb + i_h.to(tl.int64) * s_ch + i_v * BV  # the first column
    carried = tl.zeros((BK, BV), dtype=tl.float32)  # Σ_{m < l} exp(g) c^(m) stored^(m)
    weighted = tl.load(lam_row).to(tl.float32) * written  # Σ_l λ_l S^(l), level 0 the token's k vᵀ
    for i_l in range(L):
        slot = tl.full((), 0, tl.int64) + i_l
        live, into, cleared = level_flags(t, slot)
        ptrs = base + i_l * s_ll + tile
        state = tl.load(ptrs, mask=tile_mask(rk, rv, live, K, V), other=0.0)
        scale = tl.load(scale_row + i_l * s_cl, mask=live, other=0.0)
        tl.debug_barrier()  # every thread has read the level's scale before any thread overwrites it below
        value, state, scale, carried = lazy_level(state, scale, carried, written, into, cleared, decay)
        tl.store(ptrs, state, mask=tile_mask(rk, rv, into, K, V))
        store_scale(scale_row + i_l * s_cl, scale, rv, V, live | into, BV)
        weighted += tl.load(lam_row + i_l + 1).to(tl.float32) * value
    out = tl.sum(q[:, None] * weighted, 0)
    store_output(o_ptr, out, i_b, i_h, sob, soh, rv, V)


@triton.jit
def slice_start(levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V, NK,
                s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh,
                HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """What a program of the ``"split"`` schedule's grid ``(NK · V / BV, H, B)`` starts from: its number ``i_kv``
    among its head's programs, its key slice ``i_k = i_kv mod NK`` (rows ``rk = i_k · BK + [0, BK)``), its value
    block ``i_v = i_kv div NK`` and what :func:`tile_start` gives."""
    i_kv, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_k, i_v = i_kv % NK, i_kv // NK
    rk = i_k * BK + tl.arange(0, BK)
    rv, t, q, k, v, decay, base, tile, lam_row = tile_start(
        levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V,
        s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, i_v, i_h, i_b, rk, HAS_DECAY, BV)
    return i_kv, i_k, i_h, i_b, rk, rv, t, q, k, v, decay, base, tile, lam_row


@triton.jit
def store_owned_scales(row_ptr, scale, i_kv, P, V, live, COLS: tl.constexpr):
    """A level's scale (a scalar) into the value columns ``c ≡ i_kv (mod P)`` of its row at ``row_ptr`` (column 0),
    the columns program ``i_kv`` of a head's ``P`` owns in the ``"split"`` schedule, when the level is ``live``
    before or after the step; ``COLS >= ceil(V / P)``."""
    columns = i_kv + P * tl.arange(0, COLS)
    tl.store(row_ptr + columns, scale + tl.zeros((COLS,), tl.float32), mask=columns < tl.where(live, V, 0))


@triton.jit
def store_partial(partial_ptr, out, i_k, i_b, i_h, s_pk, s_pb, s_ph, rv, V):
    """Key slice ``i_k``'s part ``out [BV]`` of the output of batch ``i_b`` and head ``i_h`` at columns ``rv``, in
    fp32."""
    ptrs = partial_ptr + i_k.to(tl.int64) * s_pk + i_b.to(tl.int64) * s_pb + i_h * s_ph + rv
    tl.store(ptrs, out, mask=rv < V)


@triton.jit
def fenwick_decode_unrolled_kernel(
    levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, out_ptr,
    K, V, L: tl.constexpr, NK,
    s_lb, s_lh, s_ll, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, s_ok, s_ob, s_oh,
    HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SPLIT: tl.constexpr,
):
    """The ``"unrolled"`` schedule, eager layout, and with SPLIT the ``"split"`` one (the same on the ``BK`` key rows
    of slice ``i_k``): arguments as :func:`fenwick_decode_kernel` but ``L`` a constant and the output ``out`` with
    strides ``s_ok, s_ob, s_oh``. Without SPLIT: grid ``(V / BV, H, B)``, out is o: ``[B, H, V]`` (``NK`` and
    ``s_ok`` unused). With SPLIT: grid ``(NK · V / BV, H, B)``, ``NK = ceil(K / BK)``, out is partial:
    ``[NK, B, H, V]`` fp32, ``partial[i_k] = Σ_{k in slice i_k} q_k (Σ_l λ_l S^(l))_k``."""
    if SPLIT:
        i_kv, i_k, i_h, i_b, rk, rv, t, q, k, v, decay, base, tile, lam_row = slice_start(
            levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V, NK,
            s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, HAS_DECAY, BK, BV)
    else:
        i_v, i_h, i_b, rk, rv, t, q, k, v, decay, base, tile, lam_row = program_start(
            levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V,
            s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, HAS_DECAY, BK, BV)
    states, lams = (), (tl.load(lam_row).to(tl.float32),)
    for i_l in tl.static_range(L):  # every load issued before any is used: no store stands between them
        live, _, _ = level_flags(t, tl.full((), i_l, tl.int64))
        states += (tl.load(base + i_l * s_ll + tile, mask=tile_mask(rk, rv, live, K, V), other=0.0),)
        lams += (tl.load(lam_row + i_l + 1).to(tl.float32),)
    written = k[:, None] * v[None, :]
    carried = tl.zeros((BK, BV), dtype=tl.float32)  # Σ_{m < l} exp(g) S^(m), on the program's rows
    weighted = lams[0] * written  # Σ_l λ_l S^(l) on the program's rows, level 0 the token's k vᵀ
    for i_l in tl.static_range(L):
        live, into, cleared = level_flags(t, tl.full((), i_l, tl.int64))
        value, state, carried = eager_level(states[i_l], carried, written, into, cleared, decay)
        tl.store(base + i_l * s_ll + tile, state, mask=tile_mask(rk, rv, live | into, K, V))
        weighted += lams[i_l + 1] * value
    out = tl.sum(q[:, None] * weighted, 0)
    if SPLIT:
        store_partial(out_ptr, out, i_k, i_b, i_h, s_ok, s_ob, s_oh, rv, V)
    else:
        store_output(out_ptr, out, i_b, i_h, s_ob, s_oh, rv, V)


@triton.jit
def lazy_decode_unrolled_kernel(
    levels_ptr, scales_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, out_ptr,
    K, V, L: tl.constexpr, NK,
    s_lb, s_lh, s_ll, s_lk, s_cb, s_ch, s_cl, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, s_ok, s_ob, s_oh, P,
    HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SPLIT: tl.constexpr, COLS: tl.constexpr,
):
    """The ``"unrolled"`` schedule, lazy layout, and with SPLIT the ``"split"`` one: arguments as
    :func:`fenwick_decode_unrolled_kernel` and scales ``[B, H, L, V]`` (:func:`lazy_decode_kernel`); one barrier
    between the loads of every scale and the first store of one (the race :func:`lazy_decode_kernel` describes).
    Without SPLIT a program reads every level's scale from its first column and writes it to all of its columns
    (``P`` and ``COLS`` unused). With SPLIT, ``P = NK · V / BV <= V`` programs per head and ``COLS >= ceil(V / P)``:
    program ``i_kv`` reads every level's scale from value column ``i_kv`` and writes the new scale into the columns
    ``c ≡ i_kv (mod P)``; column ``i_kv`` is written by this program alone (module docstring), after the barrier
    that follows every read of its threads."""
    if SPLIT:
        i_kv, i_k, i_h, i_b, rk, rv, t, q, k, v, decay, base, tile, lam_row = slice_start(
            levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V, NK,
            s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, HAS_DECAY, BK, BV)
        scale_row = scales_ptr + i_b.to(tl.int64) * s_cb + i_h.to(tl.int64) * s_ch  # column 0
    else:
        i_v, i_h, i_b, rk, rv, t, q, k, v, decay, base, tile, lam_row = program_start(
            levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, K, V,
            s_lb, s_lh, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, HAS_DECAY, BK, BV)
        scale_row = scales_ptr + i_b.to(tl.int64) * s_cb + i_h.to(tl.int64) * s_ch + i_v * BV  # the first column
    states, scales, lams = (), (), (tl.load(lam_row).to(tl.float32),)
    for i_l in tl.static_range(L):  # every load issued before any is used: no store stands between them
        live, _, _ = level_flags(t, tl.full((), i_l, tl.int64))
        states += (tl.load(base + i_l * s_ll + tile, mask=tile_mask(rk, rv, live, K, V), other=0.0),)
        if SPLIT:  # column i_kv, which no other program writes
            scales += (tl.load(scale_row + i_l * s_cl + i_kv, mask=live, other=0.0),)
        else:
            scales += (tl.load(scale_row + i_l * s_cl, mask=live, other=0.0),)
        lams += (tl.load(lam_row + i_l + 1).to(tl.float32),)
    tl.debug_barrier()  # every thread has read every scale it reads before any thread overwrites one below
    written = k[:, None] * v[None, :]
    carried = tl.zeros((BK, BV), dtype=tl.float32)  # Σ_{m < l} exp(g) c^(m) stored^(m), the program's rows
    weighted = lams[0] * written  # Σ_l λ_l S^(l) on the program's rows, level 0 the token's k vᵀ
    for i_l in tl.static_range(L):
        live, into, cleared = level_flags(t, tl.full((), i_l, tl.int64))
        value, state, scale, carried = lazy_level(states[i_l], scales[i_l], carried, written, into, cleared, decay)
        tl.store(base + i_l * s_ll + tile, state, mask=tile_mask(rk, rv, into, K, V))
        if SPLIT:
            store_owned_scales(scale_row + i_l * s_cl, scale, i_kv, P, V, live | into, COLS)
        else:
            store_scale(scale_row + i_l * s_cl, scale, rv, V, live | into, BV)
        weighted += lams[i_l + 1] * value
    out = tl.sum(q[:, None] * weighted, 0)
    if SPLIT:
        store_partial(out_ptr, out, i_k, i_b, i_h, s_ok, s_ob, s_oh, rv, V)
    else:
        store_output(out_ptr, out, i_b, i_h, s_ob, s_oh, rv, V)


@triton.jit
def sum_slices_kernel(partial_ptr, o_ptr, position_ptr, N, B, NK, ADVANCE: tl.constexpr, BLOCK: tl.constexpr):
    """``o = Σ_{i < NK} partial[i]``, summed in slice order, in o's dtype; with ``ADVANCE`` also ``position += 1``.
    Grid ``(N / BLOCK,)``; partial: ``[NK, N]`` fp32 and o: ``[N]`` contiguous, ``N = B · H · V``; position:
    ``[B]`` int64. It runs after the step's kernel (one stream), which has read every position."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    ptrs = partial_ptr + offsets
    for _ in range(NK):
        total += tl.load(ptrs, mask=offsets < N, other=0.0)
        ptrs += N
    tl.store(o_ptr + offsets, total.to(o_ptr.dtype.element_ty), mask=offsets < N)
    if ADVANCE:
        position = tl.load(position_ptr + offsets, mask=offsets < B, other=0)
        tl.store(position_ptr + offsets, position + 1, mask=offsets < B)


SCHEDULES = ("loop", "unrolled", "split")
"""How a program visits the levels (module docstring): a runtime loop, unrolled with every load first, or unrolled
on one slice of the key rows."""


UNROLLED_UP_TO = 64
"""The most ``batch × heads`` pairs a step takes the ``"unrolled"`` schedule for (:func:`default_schedule`)."""


def default_schedule(batch: int, heads: int) -> str:
    """``"unrolled"`` for at most :data:`UNROLLED_UP_TO` ``(sequence, head)`` pairs, else ``"loop"``.

    One round trip for all levels pays when the step is a few programs waiting on memory latency; with more
    programs than that the GPU hides the latency of the loop's round trips behind other programs, and the
    unrolled schedule's ``L`` tiles per program cost occupancy. Measured at 48 heads, K = 128, V = 64 on the lazy
    layout (``python -m loglin_edu.bench --decode``): unrolled takes 0.87–0.91× the loop's time at batch 1,
    0.99–1.15× at batch 2 and 1.0–1.25× at batches 4–64, at contexts 4K, 64K and 1M."""
    return "unrolled" if batch * heads <= UNROLLED_UP_TO else "loop"


def default_block_v(schedule: str, levels: int, value_dim: int) -> int:
    """The value tile ``BV`` of one program: 32 for the ``"loop"`` schedule; for the ``"unrolled"`` one, which
    holds ``levels`` tiles at once (the buffer's slots), 16 up to 14 slots (16K tokens) and 8 beyond — the
    fastest tiles of the measurement in :func:`default_schedule`; 16 for the ``"split"`` one, whose tiles are
    ``block_k`` rows tall (64-byte rows, two 32-byte sectors). At most ``block(value_dim)``."""
    widest = block(value_dim)
    if schedule == "loop":
        return min(32, widest)
    if schedule == "split":
        return min(16, widest)
    return min(16 if levels <= 14 else 8, widest)


SPLIT_ROWS = 32
"""The key rows of one program of the ``"split"`` schedule by default (:func:`default_block_k`): four slices of
``K = 128``."""


def split_programs(key_dim: int, value_dim: int, block_k: int, block_v: int) -> int:
    """``P = ceil(K / block_k) · ceil(V / block_v)``: the programs of one ``(sequence, head)`` in the ``"split"``
    schedule."""
    return triton.cdiv(key_dim, block_k) * triton.cdiv(value_dim, block_v)


def default_block_k(key_dim: int, value_dim: int, block_v: int, lazy: bool) -> int:
    """The key rows ``BK`` of one program of the ``"split"`` schedule: :data:`SPLIT_ROWS` (at most
    ``block(key_dim)``), doubled on the lazy layout until a head's :func:`split_programs` are at most ``V``, one
    value column each (module docstring)."""
    rows = min(SPLIT_ROWS, block(key_dim))
    while lazy and split_programs(key_dim, value_dim, rows, block_v) > value_dim:
        rows *= 2
    return rows


class SliceRefused(ValueError):
    """A key slice the ``"split"`` schedule on the lazy layout cannot run: more programs per head than value
    columns to own (:func:`check_block_k`)."""


def check_block_k(block_k, key_dim: int, value_dim: int, block_v: int, lazy: bool) -> None:
    """``block_k`` must be a power of two from 1 to :data:`MAX_BLOCK`; on the lazy layout a head's
    :func:`split_programs` must be at most ``V``."""
    if isinstance(block_k, bool) or not isinstance(block_k, int) or not 1 <= block_k <= MAX_BLOCK or (
            block_k & (block_k - 1)):
        raise ValueError(f"block_k must be a power of two from 1 to {MAX_BLOCK}, got {block_k!r}")
    programs = split_programs(key_dim, value_dim, block_k, block_v)
    if lazy and programs > value_dim:
        raise SliceRefused(
            f"the split schedule on the lazy layout gives each of a head's ceil(K / block_k) · ceil(V / block_v) "
            f"programs a value column of its own: at most V={value_dim}, got {programs} (K={key_dim}, "
            f"block_k={block_k}, block_v={block_v})"
        )


def default_num_warps(schedule: str, levels: int, block_k: int, block_v: int) -> int:
    """Warps of one program: 4 for the ``"loop"`` schedule. The ``"unrolled"`` and ``"split"`` ones hold their
    ``levels`` tiles of ``block_k × block_v`` fp32 values (``block_k`` the slice's rows for ``"split"``) in
    registers at once: 4 warps while that is at most 96 values per thread, else 8, the warps at which a program
    gets the most registers (255 per thread; at 16 warps only 128). Wider tiles spill to local memory."""
    if schedule == "loop" or levels * block_k * block_v <= 96 * 32 * 4:
        return 4
    return 8


def step_bytes(position: int, key_dim: int, value_dim: int, lazy: bool = False, levels: int | None = None) -> int:
    """Bytes of levels (and scales) one head's step moves at ``position`` (module docstring): with
    ``p = popcount(position)`` live slots read and ``w = 1`` for the carry's target, ``(2p + w) · K · V · 4`` eager
    and ``(p + w) · K · V · 4 + (2p + w) · V · 4`` lazy. ``levels``: the buffer's slots; ``w = 0`` when the target,
    slot ``j`` with ``2^j = (position + 1) & -(position + 1)``, lies past them (None: a buffer deep enough)."""
    p = bin(position).count("1")
    target = (position + 1) & -(position + 1)
    w = int(levels is None or target < 1 << levels)
    if lazy:
        return ((p + w) * key_dim + 2 * p + w) * value_dim * 4
    return (2 * p + w) * key_dim * value_dim * 4


def decode_step_(
    levels: torch.Tensor,
    position: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    level_scales: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    *,
    decay_scales: torch.Tensor | None = None,
    schedule: str | None = None,
    block_v: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    advance: bool = True,
) -> torch.Tensor:
    """One step of log-linear Mamba-2 for every sequence, in place (module docstring).

    levels: ``[B, H, L, K, V]`` fp32, V contiguous (updated in place; slot ``i`` holds level ``i + 1``); position:
    ``[B]`` int64 (advanced by one in place unless ``advance=False``, which a benchmark uses to repeat one
    position); q, k: ``[B, H or 1, K]`` (one head shared by all, as Mamba-2's B and C); v: ``[B, H, V]``;
    level_scales: ``[B, H, >= L + 1]`` (column ``l`` for level ``l``, level 0 first); log_decay: ``[B, H]`` or None.
    Returns o ``[B, H, V]`` in v's dtype.
    decay_scales: None for the eager layout, or the lazy layout's ``[B, H, L, V]`` fp32 scales, V contiguous
    (updated in place). schedule: ``"loop"``, ``"unrolled"`` or ``"split"`` (module docstring; by default
    :func:`default_schedule`). block_v: the V-tile of one program (more programs for a small batch; by default
    :func:`default_block_v`); K must be at most 128. block_k: the key rows of one program of the ``"split"``
    schedule, a power of two (by default :func:`default_block_k`; only for that schedule). num_warps: by default
    :func:`default_num_warps`. The ``"split"`` schedule takes two launches (the step, then the sum of its key
    slices, which also advances the position); the others one (and ``position.add_(1)``).
    """
    B, H, L, K, V = levels.shape
    schedule = schedule or default_schedule(B, H)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if block_k is not None and schedule != "split":
        raise ValueError(f"block_k sets the 'split' schedule's key slices, got block_k={block_k} with {schedule!r}")
    if levels.dtype != torch.float32 or levels.stride(-1) != 1:
        raise ValueError(f"levels must be float32 with V contiguous, got {levels.dtype} strides {levels.stride()}")
    if K > MAX_BLOCK:
        raise ValueError(f"the decode kernel holds K <= {MAX_BLOCK}, got K={K}")
    if q.shape != k.shape or q.shape[0] != B or q.shape[1] not in (1, H) or q.shape[2] != K:
        raise ValueError(f"q, k must have shape [B={B}, H={H} or 1, K={K}], got {tuple(q.shape)}, {tuple(k.shape)}")
    if tuple(v.shape) != (B, H, V) or level_scales.shape[:2] != (B, H) or level_scales.shape[2] < L + 1:
        raise ValueError(
            f"v must be [B={B}, H={H}, V={V}] and level_scales [B, H, >= {L + 1}], got {tuple(v.shape)}, "
            f"{tuple(level_scales.shape)}"
        )
    if decay_scales is not None and (
        tuple(decay_scales.shape) != (B, H, L, V) or decay_scales.dtype != torch.float32 or decay_scales.stride(-1) != 1
    ):
        raise ValueError(
            f"decay_scales must be float32 [B={B}, H={H}, L={L}, V={V}] with V contiguous, got {decay_scales.dtype} "
            f"{tuple(decay_scales.shape)} strides {decay_scales.stride()}"
        )
    q, k = same_strides(q, k)  # one set of strides serves both
    v, level_scales = last_dim_contiguous(v), last_dim_contiguous(level_scales)
    BK, BV = block(K), block_v or default_block_v(schedule, L, V)
    if schedule == "split":
        BK = default_block_k(K, V, BV, decay_scales is not None) if block_k is None else block_k
        check_block_k(BK, K, V, BV, decay_scales is not None)
    if num_warps is None:
        num_warps = default_num_warps(schedule, L, BK, BV)
    o = torch.empty(B, H, V, device=v.device, dtype=v.dtype)
    g = log_decay if log_decay is not None else v  # a placeholder pointer when there is no decay
    sqh = 0 if q.shape[1] == 1 else q.stride(1)
    token_strides = (q.stride(0), sqh, v.stride(0), v.stride(1), level_scales.stride(0), level_scales.stride(1),
                     g.stride(0), g.stride(1))
    meta = dict(HAS_DECAY=log_decay is not None, BK=BK, BV=BV, num_warps=num_warps)
    if schedule != "loop":
        unrolled_launch(levels, decay_scales, position, q, k, v, level_scales, g, o, token_strides, meta,
                        schedule == "split", advance)
    elif decay_scales is None:
        fenwick_decode_kernel[(triton.cdiv(V, BV), H, B)](
            levels, position, q, k, v, level_scales, g, o, K, V, L, *levels.stride()[:4], *token_strides,
            o.stride(0), o.stride(1), **meta)
    else:
        lazy_decode_kernel[(triton.cdiv(V, BV), H, B)](
            levels, decay_scales, position, q, k, v, level_scales, g, o, K, V, L, *levels.stride()[:4],
            *decay_scales.stride()[:3], *token_strides, o.stride(0), o.stride(1), **meta)
    if advance and schedule != "split":  # the split schedule's second launch advances it
        position.add_(1)
    return o


SUM_BLOCK = 1024
"""Outputs one program of :func:`sum_slices_kernel` sums."""


def unrolled_launch(levels, decay_scales, position, q, k, v, level_scales, g, o, token_strides, meta, split, advance):
    """The ``"unrolled"`` schedule's launch (``split`` false), or the ``"split"`` schedule's two (module docstring):
    one kernel per layout serves both, ``SPLIT`` a compile-time flag. Unrolled: grid ``(V / BV, H, B)``, one key
    slice, the output into o (o ``[B, H, V]``; the caller advances the position). Split: every key slice's part of
    the output into ``partial: [NK, B, H, V]`` fp32, then ``o = Σ_i partial[i]`` (o contiguous) and, when
    ``advance``, ``position += 1`` in a second launch. Levels and scales are updated in place. token_strides: those
    of q, v, λ and g; meta: the kernels' ``HAS_DECAY``, ``BK``, ``BV`` and ``num_warps``."""
    B, H, L, K, V = levels.shape
    NK, P = triton.cdiv(K, meta["BK"]), split_programs(K, V, meta["BK"], meta["BV"])
    out = torch.empty(NK, B, H, V, device=v.device, dtype=torch.float32) if split else o
    out_strides = out.stride()[:3] if split else (0, o.stride(0), o.stride(1))
    level_strides = levels.stride()[:4]
    grid = (P, H, B)
    if decay_scales is None:
        fenwick_decode_unrolled_kernel[grid](levels, position, q, k, v, level_scales, g, out, K, V, L, NK,
                                             *level_strides, *token_strides, *out_strides, SPLIT=split, **meta)
    else:
        cols = triton.next_power_of_2(triton.cdiv(V, P)) if split else 1
        lazy_decode_unrolled_kernel[grid](levels, decay_scales, position, q, k, v, level_scales, g, out, K, V, L, NK,
                                          *level_strides, *decay_scales.stride()[:3], *token_strides, *out_strides, P,
                                          SPLIT=split, COLS=cols, **meta)
    if split:
        N = B * H * V
        sum_slices_kernel[(triton.cdiv(N, SUM_BLOCK),)](out, o, position, N, B, NK, ADVANCE=advance, BLOCK=SUM_BLOCK)


@triton.jit
def mamba2_decode_kernel(
    state_ptr, q_ptr, k_ptr, v_ptr, g_ptr, o_ptr,
    K, V,
    s_sb, s_sh, s_sk, sqb, sqh, svb, svh, sgb, sgh, sob, soh,
    HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """Grid ``(V / BV, H, B)``. state: [B, H, K, V] fp32 (V contiguous); q, k: [B, H or 1, K]; v, o: [B, H, V]."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    tile_mask = (rk[:, None] < K) & (rv[None, :] < V)
    q, k, v = load_token(q_ptr, k_ptr, v_ptr, i_b, i_h, sqb, sqh, svb, svh, rk, rv, K, V)
    ptrs = state_ptr + i_b.to(tl.int64) * s_sb + i_h.to(tl.int64) * s_sh + rk[:, None].to(tl.int64) * s_sk + rv[None, :]
    state = tl.load(ptrs, mask=tile_mask, other=0.0)
    if HAS_DECAY:
        state *= tl.exp(tl.load(g_ptr + i_b.to(tl.int64) * sgb + i_h * sgh).to(tl.float32))
    state += k[:, None] * v[None, :]
    tl.store(ptrs, state, mask=tile_mask)
    out = tl.sum(q[:, None] * state, 0)
    store_output(o_ptr, out, i_b, i_h, sob, soh, rv, V)


def mamba2_decode_step_(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    *,
    block_v: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """One Mamba-2 step in place: ``S <- exp(g) S + k vᵀ``, returns ``o = Sᵀ q``.

    state: ``[B, H, K, V]`` fp32, V contiguous; q, k: ``[B, H or 1, K]``; v: ``[B, H, V]``; log_decay:
    ``[B, H]`` or None. Returns o ``[B, H, V]`` in v's dtype.
    """
    B, H, K, V = state.shape
    if state.dtype != torch.float32 or state.stride(-1) != 1:
        raise ValueError(f"state must be float32 with V contiguous, got {state.dtype} strides {state.stride()}")
    if K > MAX_BLOCK or q.shape != k.shape or q.shape[0] != B or q.shape[1] not in (1, H) or q.shape[2] != K:
        raise ValueError(f"q, k must have shape [B={B}, H={H} or 1, K={K}] with K <= {MAX_BLOCK}, got {tuple(q.shape)}")
    q, k = same_strides(q, k)
    v = last_dim_contiguous(v)
    BV = block_v or min(block(V), 64)
    o = torch.empty(B, H, V, device=v.device, dtype=v.dtype)
    g = log_decay if log_decay is not None else v
    mamba2_decode_kernel[(triton.cdiv(V, BV), H, B)](
        state, q, k, v, g, o, K, V,
        state.stride(0), state.stride(1), state.stride(2), q.stride(0), 0 if q.shape[1] == 1 else q.stride(1),
        v.stride(0), v.stride(1), g.stride(0), g.stride(1), o.stride(0), o.stride(1),
        HAS_DECAY=log_decay is not None, BK=block(K), BV=BV, num_warps=num_warps,
    )
    return o
