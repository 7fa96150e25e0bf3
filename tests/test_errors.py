"""Bad input gets a ValueError or TypeError that names the argument, the expectation and what came."""

import pytest
import torch

import loglin_edu as le

B, T, H, K, V = 2, 10, 3, 4, 5


def good():
    return dict(
        q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V),
        level_scales=torch.ones(B, T, H, le.num_levels(T)), log_decay=-torch.rand(B, T, H), beta=torch.rand(B, T, H),
    )


def call(**changes):
    args = good() | changes
    form = args.pop("form", "chunkwise")
    chunk_size = args.pop("chunk_size", 4)
    return le.loglinear_attention(**args, form=form, chunk_size=chunk_size)


CASES = [
    (dict(q=torch.randn(B, T, H)), ValueError, ["q", "[B, T, H, K]", f"({B}, {T}, {H})"]),
    (dict(v=torch.randn(B, T, H, V, 1)), ValueError, ["v", "[B, T, H, V]"]),
    (dict(k=torch.randn(B, T, H, K + 1)), ValueError, ["k", f"K={K}", str((B, T, H, K + 1))]),
    (dict(k=torch.randn(B + 1, T, H, K)), ValueError, ["k", f"B={B}"]),
    (dict(v=torch.randn(B, T + 1, H, V)), ValueError, ["v", f"T={T}"]),
    (dict(v=torch.randn(B, T, H + 1, V)), ValueError, ["v", f"H = {H}"]),
    (dict(level_scales=torch.ones(B, T, H, 2)), ValueError, ["level_scales", "L=2", "num_levels(10) = 5"]),
    (dict(level_scales=torch.ones(B, T, H + 1, 5)), ValueError, ["level_scales", f"H={H}"]),
    (dict(level_scales=torch.ones(B, T, H)), ValueError, ["level_scales", "[B, T, H, L]"]),
    (dict(log_decay=torch.zeros(B, T)), ValueError, ["log_decay", "[B, T, H]"]),
    (dict(log_decay=torch.zeros(B, T, H + 1)), ValueError, ["log_decay", f"H={H}", str((B, T, H + 1))]),
    (dict(log_decay=torch.full((B, T, H), 0.1)), ValueError, ["log_decay", "<= 0"]),
    (dict(log_decay=torch.full((B, T, H), float("nan"))), ValueError, ["log_decay", "finite"]),
    (dict(beta=torch.rand(B, T + 1, H)), ValueError, ["beta", f"T={T}"]),
    (dict(beta=torch.full((B, T, H), float("inf"))), ValueError, ["beta", "finite"]),
    (dict(form="fast"), ValueError, ["form", "'fast'", "chunkwise"]),
    (dict(chunk_size=0), ValueError, ["chunk_size", "power of two", "0"]),
    (dict(chunk_size=-4), ValueError, ["chunk_size", "-4"]),
    (dict(chunk_size=48), ValueError, ["chunk_size", "48"]),
    (dict(chunk_size=4.0), TypeError, ["chunk_size", "int"]),
    (dict(q=torch.randn(B, T, H, K, dtype=torch.float64)), TypeError, ["k", "dtype", "float64"]),
    (dict(q=torch.ones(B, T, H, K, dtype=torch.long)), TypeError, ["q", "floating"]),
    (dict(v=[[1.0]]), TypeError, ["v", "torch.Tensor"]),
    (dict(q=torch.randn(B, 0, H, K), k=torch.randn(B, 0, H, K), v=torch.randn(B, 0, H, V)), ValueError, ["T >= 1"]),
]


@pytest.mark.parametrize("changes, error, words", CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_input_names_the_argument(changes, error, words):
    with pytest.raises(error) as info:
        call(**changes)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_tensors_on_different_devices():
    meta = good()["v"].to("meta")
    with pytest.raises(ValueError, match="v is on meta but q is on cpu"):
        call(v=meta)


@pytest.mark.parametrize(
    "fn, args, words",
    [
        (le.softmax_attention, lambda g: (g["q"], g["k"], g["v"][:, :, :1, :, None]), ["v", "[B, T, H, V]"]),
        (le.linear_attention, lambda g: (g["q"], g["k"][:, :, :, :2], g["v"]), ["k", f"K={K}"]),
        (le.mamba2_attention, lambda g: (g["q"], g["k"], g["v"], g["log_decay"][..., :1]), ["log_decay", f"H={H}"]),
        (le.gated_deltanet_attention, lambda g: (g["q"], g["k"], g["v"], g["log_decay"], g["beta"][:1]),
         ["beta", f"B={B}"]),
        (le.gated_deltanet_attention, lambda g: (g["q"], g["k"], g["v"], g["log_decay"], None), ["beta", "None"]),
    ],
    ids=["softmax", "linear", "mamba2", "gated_deltanet", "gated_deltanet_without_beta"],
)
def test_every_operator_checks_its_inputs(fn, args, words):
    with pytest.raises((ValueError, TypeError)) as info:
        fn(*args(good()))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("fn", [le.softmax_attention, le.linear_attention])
def test_unknown_form_for_every_operator(fn):
    g = good()
    with pytest.raises(ValueError, match="form must be one of"):
        fn(g["q"], g["k"], g["v"], form="quadratic")


def test_decoding_state_needs_enough_levels():
    state = le.FenwickState()
    x = torch.randn(1, 1, 2)
    for t in range(4):
        lam = torch.ones(1, 1, 3)
        state.step(x, x, x, lam)
    with pytest.raises(ValueError, match="level_scales has L=2 levels but token 4 needs 4"):
        state.step(x, x, x, torch.ones(1, 1, 2))


def test_compare_forms_needs_a_repeat():
    g = good()
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        le.compare_forms(le.linear_attention, g["q"], g["k"], g["v"], repeats=0)
