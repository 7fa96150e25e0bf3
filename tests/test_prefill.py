"""Prefill hands off to decoding: the state after a prefix, from every form, is the Fenwick state the
recurrent form holds, and decoding on from it gives the full sequence's outputs (float64, 1e-10)."""

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import loglin_edu as le
from loglin_edu.chunk_scan import chunk_scan
from loglin_edu.state import prefix_state
from operators import LOGLINEAR, OPERATORS, assert_close

IDS = [op.name for op in LOGLINEAR]


def split_args(op, args):
    """q, k, v, λ, log_decay, beta from an operator's inputs (missing gates as None)."""
    q, k, v, lam, *gates = args
    if op.decay and op.delta:
        g, b = gates
    elif op.delta:
        g, b = None, gates[1]
    else:
        g, b = (gates[0] if gates else None), None
    return q, k, v, lam, g, b


def prefix(x, t):
    return None if x is None else x[:, :t]


def decode_on(state, q, k, v, lam, g, b, start):
    """Step ``state`` through tokens ``start..T-1``; returns their outputs ``[B, T - start, H, V]``."""
    H = v.shape[2]
    outputs = []
    for t in range(start, v.shape[1]):
        step = [x[:, t].expand(-1, H, -1) for x in (q, k)] + [v[:, t], lam[:, t]]
        step += [None if x is None else x[:, t] for x in (g, b)]
        outputs.append(state.step(*step))
    return torch.stack(outputs, dim=1) if outputs else v[:, :0]


def check_hand_off(op, T, t, chunk_size, seed, shared_qk, form="chunkwise", H=2):
    args = op.inputs(B=2, T=T, H=H, K=3, V=2, seed=seed, shared_qk=shared_qk)
    q, k, v, lam, g, b = split_args(op, args)
    full = le.loglinear_attention(q, k, v, lam, g, b, form="naive")
    if t == 0:
        head, state = v[:, :0], le.FenwickState()
    else:
        head, state = le.loglinear_attention(
            *(prefix(x, t) for x in (q, k, v)), lam[:, :t], prefix(g, t), prefix(b, t),
            form=form, chunk_size=chunk_size, return_state=True,
        )
    assert state.position == t
    tail = decode_on(state, q, k, v, lam, g, b, start=t)
    where = f"{op.name} T={T} prefill t={t} C={chunk_size} form={form} shared_qk={shared_qk}"
    assert_close(torch.cat([head, tail], dim=1), full, what=where)


def states_equal(state, reference, where):
    assert state.position == reference.position, where
    assert len(state.levels) == len(reference.levels), (where, len(state.levels), len(reference.levels))
    for lvl, (s, r) in enumerate(zip(state.levels, reference.levels)):
        assert (s is None) == (r is None), f"{where}: level {lvl} live {s is not None}, expected {r is not None}"
        if s is not None:
            assert_close(s, r, what=f"{where} level {lvl}")


def hand_off_lengths(T, chunk_size):
    """0, 1, powers of two and their neighbours, chunk boundaries ± 1, a random length: all < T."""
    lengths = {0, 1, T - 1}
    for p in range(1, T.bit_length() + 1):
        lengths |= {2**p - 1, 2**p, 2**p + 1}
    for boundary in range(chunk_size, T + 1, chunk_size):
        lengths |= {boundary - 1, boundary, boundary + 1}
    lengths.add(random.Random(T * chunk_size).randrange(T))
    return sorted(t for t in lengths if 0 <= t < T)


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
@pytest.mark.parametrize("shared_qk", [False, True], ids=["per_head", "shared_qk"])
def test_chunk_scan_prefill_then_decoding_is_the_full_forward(op, shared_qk):
    T, C = 40, 8
    for t in hand_off_lengths(T, C):
        check_hand_off(op, T, t, C, seed=t, shared_qk=shared_qk)


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
@given(
    T=st.integers(2, 150),
    data=st.data(),
    log2_chunk=st.integers(0, 6),
    seed=st.integers(0, 2**31 - 1),
    shared_qk=st.booleans(),
)
def test_hand_off_at_any_length(op, T, data, log2_chunk, seed, shared_qk):
    t = data.draw(st.integers(0, T - 1), label="t")
    check_hand_off(op, T, t, 2**log2_chunk, seed, shared_qk, H=data.draw(st.integers(1, 3), label="H"))


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
@pytest.mark.parametrize("form", ["naive", "recurrent"])
def test_every_form_returns_the_state(op, form):
    for t in (1, 5, 16, 33):
        check_hand_off(op, 40, t, 16, seed=t, shared_qk=False, form=form)


@pytest.mark.parametrize("op", LOGLINEAR, ids=IDS)
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_prefill_state_is_the_stepped_state(op, chunk_size):
    """Level by level, the chunk scan's state and the definition's equal what stepping the tokens holds."""
    for T in (1, 2, 3, 4, 7, 8, 9, 31, 64, 65, 100):
        args = op.inputs(B=1, T=T, H=2, K=3, V=2, seed=T, shared_qk=True)
        q, k, v, lam, g, b = split_args(op, args)
        stepped = le.FenwickState()
        decode_on(stepped, q, k, v, lam, g, b, start=0)
        heads = [x.transpose(1, 2).expand(-1, 2, -1, -1) for x in (q, k)] + [v.transpose(1, 2), lam.transpose(1, 2)]
        gates = [None if x is None else x.transpose(1, 2) for x in (g, b)]
        _, scanned = chunk_scan(*heads, *gates, chunk_size=chunk_size, return_state=True)
        where = f"{op.name} T={T} C={chunk_size}"
        states_equal(scanned, stepped, f"chunk scan {where}")
        states_equal(prefix_state(heads[1], heads[2], *gates), stepped, f"definition {where}")
        assert scanned.num_states == bin(T - 1).count("1") + 1
        assert len(scanned.levels) == le.num_levels(T)


def test_state_does_not_depend_on_queries_or_level_scales():
    op = LOGLINEAR[-1]
    q, k, v, lam, g, b = split_args(op, op.inputs(B=1, T=50, H=2, K=3, V=2, seed=0))
    _, state = le.loglinear_attention(q, k, v, lam, g, b, chunk_size=8, return_state=True)
    _, other = le.loglinear_attention(2 * q, k, v, lam + 1, g, b, chunk_size=8, return_state=True)
    states_equal(other, state, "other q and λ")


def test_return_state_must_be_a_bool():
    op = LOGLINEAR[0]
    with pytest.raises(TypeError, match="return_state must be a bool, got str"):
        le.loglinear_attention(*op.inputs(B=1, T=4, H=1, K=2, V=2, seed=0), return_state="yes")


def test_triton_form_returns_the_state_in_float32():
    """The kernel's prefill hands a float32 state to decoding (under Triton's interpreter on a CPU)."""
    pytest.importorskip("triton")
    op = LOGLINEAR[1]  # log-linear Mamba-2: the variant the kernel computes
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, lam, g, _ = split_args(op, op.inputs(B=1, T=40, H=2, K=4, V=4, seed=0, shared_qk=True))
    full = le.loglinear_attention(q, k, v, lam, g, form="naive")
    t = 37
    wide = [x.to(device, torch.float32) for x in (q, k, v, lam, g)]
    head, state = le.loglinear_attention(*(x[:, :t] for x in wide), form="triton", chunk_size=16, return_state=True)
    assert all(s.dtype == torch.float32 for s in state.levels if s is not None)
    tail = decode_on(state, *wide, None, start=t)
    assert_close(torch.cat([head, tail], dim=1).double().cpu(), full, rtol=1e-5, what="triton prefill + decoding")


LINEAR = [op for op in OPERATORS if not op.level_scales and op.name != "softmax"]


@pytest.mark.parametrize("op", LINEAR, ids=[op.name for op in LINEAR])
@pytest.mark.parametrize("form", ["naive", "recurrent", "chunkwise"])
def test_linear_prefill_returns_the_final_state(op, form):
    """The linear models hand off one ``[B, H, K, V]`` state; the recurrence continues from it."""
    from loglin_edu.ops import mix
    from loglin_edu.recurrence import read, transition, write

    T, t, H = 45, 19, 2
    q, k, v, *gates = op.inputs(B=2, T=T, H=H, K=3, V=2, seed=5, shared_qk=True)
    g = gates[0] if op.decay else None
    b = gates[-1] if op.delta else None
    full = mix(q, k, v, g, b, form="naive")
    head, state = mix(*(None if x is None else x[:, :t] for x in (q, k, v, g, b)), form=form, chunk_size=8,
                      return_state=True)
    tail = []
    for s in range(t, T):
        k_s, g_s, b_s = k[:, s].expand(-1, H, -1), None if g is None else g[:, s], None if b is None else b[:, s]
        state = transition(state, k_s, g_s, b_s) + write(k_s, v[:, s], b_s)
        tail.append(read(state, q[:, s].expand(-1, H, -1)))
    assert_close(torch.cat([head, torch.stack(tail, dim=1)], dim=1), full, what=f"{op.name} {form} hand-off")
