"""The Triton kernels on the CPU, under Triton's interpreter (TRITON_INTERPRET=1, set in conftest.py).

Each step of the ladder against the package's float64 forms, fp32 with exact (ieee) dots; then
``loglinear_attention(form="triton")`` forward and every gradient; guard bands around every input and
output; the benchmark's CPU tier. The interpreter is slow: shapes are small, chunks of 16 tokens make
several chunk levels out of a few hundred tokens.
"""

import functools
from dataclasses import replace

import pytest
import torch

import loglin_edu as le
from kernel_helpers import DEVICE, grads_of, guard_intact, padded_copy, padded_view, peak_new_bytes, zero_fill_sizes
from operators import assert_close

kernels = pytest.importorskip("loglin_edu.kernels.step5_loglinear_mamba2")

from loglin_edu.kernels import interpreted  # noqa: E402
from loglin_edu.kernels.config import PRECISIONS, LaunchConfig  # noqa: E402
from loglin_edu.kernels.inputs import chunk_decay  # noqa: E402
from loglin_edu.kernels.step4_tree_backward import loglinear_backward  # noqa: E402
from loglin_edu.kernels.step3_chunk_tree import loglinear_forward  # noqa: E402
from loglin_edu.kernels.step2_intra_chunk import intra_chunk  # noqa: E402
from loglin_edu.kernels.step1_mamba2_chunked import mamba2_triton  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy's, from inside the interpreter
if DEVICE == "cpu" and not interpreted():
    pytest.skip("TRITON_INTERPRET=1 must be set before triton is imported", allow_module_level=True)


def inputs(B, T, H, Hk, K, V, seed=0, dtype=torch.float64, decay=True):
    """q, k ``[B, T, Hk, K]``, v, λ (one level more than needed), log decay in (-0.5, 0]."""
    gen = torch.Generator().manual_seed(seed)
    x = [torch.randn(B, T, Hk, K, generator=gen), torch.randn(B, T, Hk, K, generator=gen),
         torch.randn(B, T, H, V, generator=gen), 0.5 + torch.rand(B, T, H, le.num_levels(T) + 1, generator=gen),
         -0.5 * torch.rand(B, T, H, generator=gen) if decay else None]
    return [None if a is None else a.to(DEVICE, dtype) for a in x]


def check_against_float64(fn, reference, args, rtol, what):
    """fp32 kernels against the float64 form; the absolute floor covers a gradient that is exactly zero
    in float64 (d log_decay at T = 1 is q·dq - k·dk, two equal fp32 numbers)."""
    out, grads = grads_of(fn, [None if a is None else a.float() for a in args])
    ref, ref_grads = grads_of(reference, args)
    assert out.dtype == torch.float32
    assert_close(out.double(), ref, rtol=rtol, atol=1e-6, what=f"{what}: o")
    names = ["dq", "dk", "dv", "dlevel_scales", "dlog_decay"] if len(grads) == 5 else ["dq", "dk", "dv", "dlog_decay"]
    for name, g, r in zip(names, grads, ref_grads):
        assert_close(g.double(), r, rtol=rtol, atol=1e-6, what=f"{what}: {name}")
    return grads


# --- step 1: chunked Mamba-2 -----------------------------------------------------------------------


@pytest.mark.parametrize("B, T, H, Hk, K, V, C", [(2, 50, 3, 1, 8, 5, 16), (1, 37, 2, 2, 20, 70, 32), (1, 1, 1, 1, 3, 2, 16)])
def test_step1_mamba2_forward_and_gradients(B, T, H, Hk, K, V, C):
    args = inputs(B, T, H, Hk, K, V)
    q, k, v, _, g = args
    check_against_float64(
        lambda q, k, v, g: mamba2_triton(q, k, v, g, chunk_size=C),
        lambda q, k, v, g: le.mamba2_attention(q, k, v, g, form="naive"),
        [q, k, v, g], rtol=2e-6, what=f"step 1 T={T}",
    )


# --- step 2: the intra-chunk levels ----------------------------------------------------------------


@pytest.mark.parametrize("T, Hk, C", [(50, 1, 16), (100, 2, 32)])
def test_step2_intra_chunk_matches_the_chunk_scan_term(T, Hk, C):
    from loglin_edu.layout import heads_first
    from loglin_edu.chunk_scan import intra_chunk_scales
    from loglin_edu.chunking import chunk_terms, split_chunks

    q, k, v, lam, g = inputs(2, T, 2, Hk, 12, 9)
    out = intra_chunk(*(x.float() for x in (q, k, v, lam, g)), chunk_size=C)
    qh, kh, vh = (heads_first(x, 2) for x in (q, k, v))
    terms = chunk_terms(qh, kh, vh, g.transpose(1, 2), None, C)
    scales = intra_chunk_scales(split_chunks(lam.transpose(1, 2), C), C)
    ref = ((terms.intra * scales) @ split_chunks(vh, C)).flatten(2, 3)[:, :, :T].transpose(1, 2)
    assert_close(out.double(), ref, rtol=1e-6, what="intra-chunk kernel")


# --- step 3: the Fenwick tree over chunks and the output ---------------------------------------------

SHAPES = [  # B, T, H, Hk, K, V, chunk size, launch config
    (2, 50, 3, 1, 8, 5, 16, LaunchConfig(head_group=3, block_levels=2)),  # shared q/k, T off the chunk grid
    (1, 300, 2, 2, 20, 70, 16, LaunchConfig(head_group=2, block_levels=2)),  # 5 chunk levels, 3 above the blocks
    (1, 300, 2, 1, 4, 7, 16, LaunchConfig(head_group=1, block_levels=1)),
    (1, 130, 4, 1, 4, 4, 16, LaunchConfig(head_group=2, block_levels=4)),  # every level inside one block
    (2, 10, 2, 2, 3, 3, 32, LaunchConfig()),  # T < chunk
    (1, 1, 1, 1, 2, 2, 16, LaunchConfig()),  # one token
]
IDS = [f"T{s[1]}-H{s[2]}-Hk{s[3]}-K{s[4]}-V{s[5]}-C{s[6]}-m{s[7].block_levels}" for s in SHAPES]


@pytest.mark.parametrize("B, T, H, Hk, K, V, C, config", SHAPES, ids=IDS)
def test_step3_forward_matches_chunkwise(B, T, H, Hk, K, V, C, config):
    q, k, v, lam, g = inputs(B, T, H, Hk, K, V, seed=T)
    gc, gend = chunk_decay(g.float(), B, T, H, C, q.device)
    out, _ = loglinear_forward(*(x.float() for x in (q, k, v, lam)), gc, gend, C, config)
    ref = le.loglinear_attention(q, k, v, lam, g, form="chunkwise")
    assert_close(out.double(), ref, rtol=2e-6, what=f"forward T={T}")


# --- steps 4-5: the backward and the autograd Function -----------------------------------------------


ARRANGEMENTS = {  # how the backward's launches are arranged: each computes the same gradients
    "two-kernels": {}, "fused-grads": dict(fused_grads=True), "node-grads-in-blocks": dict(node_grads_in_blocks=True),
}


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("B, T, H, Hk, K, V, C, config", SHAPES, ids=IDS)
def test_forward_and_every_gradient_match_float64(B, T, H, Hk, K, V, C, config, arrangement):
    """o and every gradient against float64, the per-chunk gradients by two kernels (dk, dv; dq, dλ), by one
    (``fused_grads``), or with the node gradients inside the blocks formed by dk, dv's programs
    (``node_grads_in_blocks``)."""
    config = replace(config, **ARRANGEMENTS[arrangement])
    check_against_float64(
        lambda *a: kernels.loglinear_mamba2(*a, chunk_size=C, config=config),
        lambda *a: le.loglinear_attention(*a, form="naive"),
        inputs(B, T, H, Hk, K, V, seed=T + 1), rtol=2e-6, what=f"T={T}, {arrangement}",
    )


@pytest.mark.parametrize("extra_columns", [0, 27], ids=["L10-exactly-the-levels", "L37-wider-than-needed"])
def test_level_scales_of_any_width_match_float64(extra_columns):
    """λ is read and dλ written one column per level. T = 333 in chunks of 16 needs 10 levels (4 inside a
    chunk plus level 0, 5 chunk levels): not a power of two; 27 more columns make λ wider than any tile
    of the levels. o and every gradient match float64, and dλ of the columns no pair uses is zero."""
    B, T, H, C = 1, 333, 1, 16
    q, k, v, _, g = inputs(B, T, H, 1, 8, 6, seed=11)
    levels = le.num_levels(T)
    assert levels == 10
    lam = (0.5 + torch.rand(B, T, H, levels + extra_columns, generator=torch.Generator().manual_seed(12))).to(q)
    grads = check_against_float64(
        lambda *a: kernels.loglinear_mamba2(*a, chunk_size=C, config=LaunchConfig(block_levels=2)),
        lambda *a: le.loglinear_attention(*a, form="naive"),
        [q, k, v, lam, g], rtol=2e-6, what=f"T={T}, L={lam.shape[-1]}",
    )
    assert not grads[3][..., levels:].any(), "dλ written in a column no pair uses"


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_16_bit_inputs_match_float64_of_the_same_rounded_inputs(precision, arrangement):
    """fp16 through the whole autograd Function at every rung of the precision ladder (split leaf, fp32
    states, tf32x3 products), the backward's launches arranged each way (:data:`ARRANGEMENTS`): every output
    within fp16's rounding of float64 on the same fp16 inputs."""
    from loglin_edu.bench.accuracy import accuracy

    result = accuracy((1, 300, 2, 1, 20, 24), torch.float16, torch.device(DEVICE),
                      config=LaunchConfig(block_levels=2, precision=precision, **ARRANGEMENTS[arrangement]))
    bad = {name: e for name, e in result["errors"].items() if not e <= 2e-3}
    assert not bad, f"precision={precision}, {arrangement}: {bad}"


@pytest.mark.parametrize("precision, in_kernels", [("fast", False), ("split", True)])
def test_fused_gradients_with_16_bit_nodes_are_the_default_ones(precision, in_kernels, monkeypatch):
    """16-bit nodes (fp16 here, as bf16 calls store them at these rungs), so the backward reads the nodes'
    residuals; shared q/k in two head groups: the fused kernel (``fused_grads``) gives the two kernels' o and every
    gradient to fp16's rounding (it uses the same roundings: under the interpreter, bit for bit), d log_decay's sum
    inside the kernels or by the host."""
    from loglin_edu.bench.accuracy import relative_error
    from loglin_edu.kernels import step3_chunk_tree as chunk_tree
    from loglin_edu.kernels import step4_tree_backward as backward

    sixteen = lambda dtype, precision="fast": torch.float16  # noqa: E731
    monkeypatch.setattr(chunk_tree, "state_dtype", sixteen)
    monkeypatch.setattr(backward, "state_dtype", sixteen)
    args = [x.half() for x in inputs(1, 100, 4, 1, 16, 16, seed=8)]
    config = LaunchConfig(block_levels=1, precision=precision, grad_head_group=2, grad_sums_in_kernels=in_kernels)
    assert kernels.loglinear_mamba2_forward(*args, 16, kernels.config_name(config), True)[4].numel() > 0, \
        "no residuals to read"
    runs = [grads_of(lambda *a: kernels.loglinear_mamba2(*a, chunk_size=16, config=c), args)
            for c in (config, replace(config, fused_grads=True))]
    (ref, ref_grads), (out, grads) = runs
    assert out.dtype == torch.float16
    for name, a, b in zip(("o", "dq", "dk", "dv", "dlevel_scales", "dlog_decay"), (out, *grads), (ref, *ref_grads)):
        assert relative_error(a, b) <= 2.0**-11, f"{precision}: {name} {relative_error(a, b):.1e}"


@pytest.mark.slow
@pytest.mark.parametrize("node_type", ["fp32 nodes", "16-bit nodes", "16-bit nodes, register tree, sums in kernels"])
def test_decay_gradient_does_not_grow_with_T_in_16_bit(node_type, monkeypatch):
    """``d log_decay`` is a reverse cumulative sum of terms whose total cancels; unless the backward
    uses exactly what the forward multiplied, its error grows like sqrt(T) (fp16, T = 2048: 7.9e-4
    against 2.9e-4 for o, with the leaf keys unrounded in the backward). fp16 stands in for bf16, whose dots the interpreter gets
    wrong; "16-bit nodes" stores the tree in fp16 as bf16 calls do, which exercises the nodes' residuals."""
    from loglin_edu.bench.accuracy import accuracy
    from loglin_edu.kernels import step3_chunk_tree as chunk_tree
    from loglin_edu.kernels import step4_tree_backward as backward

    if node_type.startswith("16-bit nodes"):
        sixteen = lambda dtype, precision="fast": torch.float16  # noqa: E731
        monkeypatch.setattr(chunk_tree, "state_dtype", sixteen)
        monkeypatch.setattr(backward, "state_dtype", sixteen)
    config = LaunchConfig(tree_registers=True, grad_sums_in_kernels=True) if "register" in node_type else None
    errors = accuracy((1, 2048, 2, 1, 16, 16), torch.float16, torch.device(DEVICE), config=config)["errors"]
    others = max(e for name, e in errors.items() if name != "dlog_decay")
    assert errors["dlog_decay"] <= 1.5 * others, errors


def test_backward_fills_no_zero_gradient_for_the_tree():
    """The tree (nodes, residuals) is an output of the autograd Function only to be saved; autograd must
    not zero-fill a gradient for it (at the benchmark's size that was 1.5 GiB and a memset per step)."""
    q, k, v, lam, g = (x.float().requires_grad_(True) for x in inputs(1, 300, 2, 1, 16, 16))
    o = kernels.loglinear_mamba2(q, k, v, lam, g, chunk_size=16)
    states = -(-300 // 16) * 2 * 16 * 16  # one K x V node per chunk and head
    sizes = zero_fill_sizes(lambda: o.sum().backward())
    assert all(n < states for n in sizes), sizes


def test_peak_counts_the_storages_alive_at_once():
    def run():
        a, b = torch.empty(256), torch.empty(128, dtype=torch.float64)
        b[:64].zero_()  # a view and an in-place op: nothing new
        del a
        torch.empty(200)

    assert peak_new_bytes(run) == 256 * 4 + 128 * 8


@pytest.mark.skipif(DEVICE != "cpu", reason="counts the interpreter's allocations")
@pytest.mark.parametrize("in_blocks", [False, True], ids=["node-grad-kernel", "node-grads-in-blocks"])
def test_backward_holds_the_node_gradients_next_to_one_head_share_at_most(in_blocks):
    """The backward's largest moment: the fp32 node gradients (those above the blocks in their own block-root
    slots, no second buffer), dk's per-head shares, dv and k·dk. dq's shares and dλ come after the node gradients
    are freed, whichever kernel formed them."""
    B, T, H, K, V, C = 1, 128, 2, 16, 32, 16
    config = LaunchConfig(block_levels=2, node_grads_in_blocks=in_blocks)  # 8 chunks: 3 levels, one above the blocks
    q, k, v, lam, g = (x.float() for x in inputs(B, T, H, 1, K, V))
    gc, gend = chunk_decay(g, B, T, H, C, q.device)
    _, tree = loglinear_forward(q, k, v, lam, gc, gend, C, config)
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(3))
    node_grads, dk_shares, dv, k_dk = (4 * n for n in (B * H * (T // C) * K * V, B * T * H * K, B * T * H * V, B * H * T))
    peak = peak_new_bytes(lambda: loglinear_backward(q, k, v, lam, gc, gend, tree, do, C, config))
    assert peak == node_grads + dk_shares + dv + k_dk


@pytest.mark.skipif(DEVICE != "cpu", reason="counts the interpreter's allocations")
@pytest.mark.parametrize("in_kernels", [False, True], ids=["host-sums", "sums-in-kernels"])
def test_fused_backward_holds_the_node_gradients_next_to_dq_buffers(in_kernels):
    """With ``fused_grads`` one kernel reads the node gradients and writes dq: its launch is the largest moment, the
    node gradients, dk's and dq's per-head shares, dv, dλ, q·dq (fp64 with the sums in kernels) and k·dk (not stored
    with the sums in kernels)."""
    B, T, H, K, V, C = 1, 128, 2, 16, 32, 16
    config = LaunchConfig(block_levels=2, fused_grads=True, grad_sums_in_kernels=in_kernels)
    q, k, v, lam, g = (x.float() for x in inputs(B, T, H, 1, K, V))
    gc, gend = chunk_decay(g, B, T, H, C, q.device)
    _, tree = loglinear_forward(q, k, v, lam, gc, gend, C, config)
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(3))
    node_grads, shares, dv, dlam = (4 * n for n in (B * H * (T // C) * K * V, B * T * H * K, B * T * H * V,
                                                    B * T * H * lam.shape[3]))
    decay_sums = B * H * T * (8 if in_kernels else 4 + 4)  # q·dq, and k·dk unless summed in the kernels
    peak = peak_new_bytes(lambda: loglinear_backward(q, k, v, lam, gc, gend, tree, do, C, config))
    assert peak == node_grads + 2 * shares + dv + dlam + decay_sums


# --- launch variants: each computes the default's function -------------------------------------------

VARIANT_SHAPES = [  # B, T, H, Hk, K, V, chunk size, block_levels
    (2, 50, 3, 1, 8, 5, 16, 2),  # shared q/k, T off the chunk grid, a partial last block
    (1, 200, 2, 2, 20, 30, 16, 2),  # per-head q/k, 2 levels above the blocks; K = 20: two key tiles of 16 rows
    (1, 130, 2, 1, 40, 4, 16, 4),  # every level inside one partial block; K = 40: two key tiles of 32 rows
    (2, 10, 2, 2, 3, 3, 32, 4),  # T < chunk
]
VARIANT_IDS = [f"T{s[1]}-H{s[2]}-Hk{s[3]}-K{s[4]}-m{s[7]}" for s in VARIANT_SHAPES]
TREE_VARIANTS = {  # fields of LaunchConfig besides block_levels
    "key-split": dict(tree_key_split=2, upper_row_split=4),
    "registers": dict(tree_registers=True),
    "registers-no-prefetch-key-split": dict(tree_registers=True, tree_prefetch=False, tree_key_split=4, upper_row_split=2),
    "registers-m1": dict(tree_registers=True, tree_block_levels=1),
}


@functools.lru_cache
def default_forward(shape):
    """The inputs, o and tree of the default launch for a shape of :data:`VARIANT_SHAPES`."""
    B, T, H, Hk, K, V, C, m = shape
    q, k, v, lam, g = (x.float() for x in inputs(B, T, H, Hk, K, V, seed=T + 2))
    gc, gend = chunk_decay(g, B, T, H, C, q.device)
    return (q, k, v, lam, gc, gend), loglinear_forward(q, k, v, lam, gc, gend, C, LaunchConfig(block_levels=m))


@pytest.mark.parametrize("variant", TREE_VARIANTS)
@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=VARIANT_IDS)
def test_tree_variants_build_the_default_tree_bit_for_bit(shape, variant):
    """fp32: split key rows, the register schedule (pending nodes held, next chunk prefetched or not, the levels
    above the blocks merged from the fp32 roots) and a smaller fused subtree store the same nodes in every slot
    that is read, and give the same o, bit for bit. Under Triton's interpreter a product is numpy's, and a BLAS may
    sum one row's terms in another order when the product has fewer rows (OpenBLAS does on AMD Zen): there the
    variants that split rows agree to fp32 round-off instead."""
    args, (ref, ref_tree) = default_forward(shape)
    B, T, H, Hk, K, V, C, m = shape
    out, tree = loglinear_forward(*args, C, LaunchConfig(block_levels=m, **TREE_VARIANTS[variant]))
    N = -(-T // C)
    nodes, ref_nodes = tree.nodes[:, :, : N - 1], ref_tree.nodes[:, :, : N - 1]  # slot N - 1 has no reader
    if interpreted() and {"tree_key_split", "upper_row_split"} & set(TREE_VARIANTS[variant]):
        assert_close(nodes, ref_nodes, rtol=1e-6, atol=0.0, what=f"{variant}: nodes")
        assert_close(out, ref, rtol=1e-6, atol=0.0, what=f"{variant}: o")
    else:
        assert torch.equal(nodes, ref_nodes)
        assert torch.equal(out, ref)


@pytest.mark.slow
@pytest.mark.parametrize("m", [5, 6])
def test_register_tree_of_the_deepest_blocks_builds_the_default_tree(m):
    """fp32, blocks of 2^5 and 2^6 chunks, whose pending nodes of levels 4 and 5 only these heights hold: the same
    nodes in every slot that is read as the default tree (which merges every level above 2^2 chunks after the
    blocks)."""
    from loglin_edu.kernels.step3_chunk_tree import build_tree

    B, T, H, K, V, C = 1, 16 * 150, 2, 4, 4, 16
    q, k, v, lam, g = (x.float() for x in inputs(B, T, H, 1, K, V, seed=m))
    gc, gend = chunk_decay(g, B, T, H, C, q.device)
    ref = build_tree(k, v, gc, gend, C, LaunchConfig(block_levels=2)).nodes
    nodes = build_tree(k, v, gc, gend, C, LaunchConfig(block_levels=2, tree_registers=True, tree_block_levels=m)).nodes
    N = -(-T // C)
    assert torch.equal(nodes[:, :, : N - 1], ref[:, :, : N - 1])


def test_register_tree_keeps_16_bit_nodes_and_residuals_of_its_fp32_states(monkeypatch):
    """16-bit nodes (fp16 here, as bf16 calls store them): the register schedule merges its children unrounded, so
    each node plus its residual is its fp32 state to the residual's rounding — the state the same schedule stores
    with fp32 nodes (fp16 calls keep fp32 nodes)."""
    from loglin_edu.kernels import step3_chunk_tree as chunk_tree

    B, T, H, K, V, C = 1, 300, 2, 20, 12, 16
    q, k, v, lam, g = (x.half() for x in inputs(B, T, H, 1, K, V, seed=4))
    gc, gend = chunk_decay(g, B, T, H, C, q.device, q.dtype)
    config = LaunchConfig(block_levels=2, tree_registers=True, tree_key_split=2)
    exact = chunk_tree.build_tree(k, v, gc, gend, C, config).nodes  # fp32 nodes
    monkeypatch.setattr(chunk_tree, "state_dtype", lambda dtype, precision="fast": torch.float16)
    nodes, residuals = chunk_tree.build_tree(k, v, gc, gend, C, config)
    assert nodes.dtype == residuals.dtype == torch.float16
    N = -(-T // C)
    kept = (nodes.float() + residuals.float())[:, :, : N - 1]
    exact = exact[:, :, : N - 1]
    assert ((kept - exact).abs() <= 2.0**-20 * exact.abs() + 2.0**-24).all()  # 2^-24: fp16's subnormal residuals


def test_calls_without_grad_skip_the_residuals_only_the_backward_reads(monkeypatch):
    """Without grad mode the register schedule stores no residuals (no merge reads them) and o is unchanged; the
    default schedule merges through them and keeps them."""
    from loglin_edu.kernels import step3_chunk_tree as chunk_tree

    monkeypatch.setattr(chunk_tree, "state_dtype", lambda dtype, precision="fast": torch.float16)
    q, k, v, lam, g = (x.half() for x in inputs(1, 100, 2, 1, 8, 8, seed=6))
    passed = []
    apply = kernels.loglinear_mamba2_forward
    monkeypatch.setattr(kernels, "loglinear_mamba2_forward", lambda *a: passed.append(a[-1]) or apply(*a))
    for config, kept in ((LaunchConfig(block_levels=2, tree_registers=True), False), (LaunchConfig(block_levels=2), True)):
        with torch.no_grad():
            out = kernels.loglinear_mamba2(q, k, v, lam, g, chunk_size=16, config=config)
        assert passed[-1] is False
        outputs = apply(q, k, v, lam, g, 16, kernels.config_name(config), False)
        assert (outputs[4].numel() > 0) == kept
        with_grad = kernels.loglinear_mamba2(q, k, v, lam, g, chunk_size=16, config=config)
        assert passed[-1] is True
        assert torch.equal(out, outputs[0]) and torch.equal(out, with_grad)


GRAD_VARIANTS = {  # fields of LaunchConfig besides block_levels
    "sums-in-kernels": dict(grad_sums_in_kernels=True),
    "sums-in-kernels-group2": dict(grad_sums_in_kernels=True, grad_head_group=2),
    "one-group": dict(grad_head_group=4),
    "register-tree-one-group-in-kernels": dict(grad_sums_in_kernels=True, grad_head_group=4, tree_registers=True),
    "decay-sums-in-kernels": dict(decay_sums_in_kernels=True),
    "backward-launch": dict(grad_warps=2, node_grad_warps=8, grad_stages=1),
    "fused": dict(fused_grads=True),  # with shared q/k, one group per head: the host sums the shares
    "fused-sums-in-kernels-group2": dict(fused_grads=True, grad_sums_in_kernels=True, grad_head_group=2),
    "fused-one-group-in-kernels": dict(fused_grads=True, grad_sums_in_kernels=True, grad_head_group=4),
}
GRAD_SHAPES = {"T40-shared": (1, 40, 4, 1, 8, 5, 16), "T40-heads": (1, 40, 2, 2, 20, 6, 16), "T10": (1, 10, 4, 1, 3, 3, 32),
               "T40-12-heads": (1, 40, 12, 1, 8, 5, 16)}  # 12 head groups share 16 rows 2 by 2: 4 get none


@functools.lru_cache
def default_grads(shape):
    """o and every gradient of the default launch (block_levels=1: a level above the blocks at T = 40)."""
    B, T, H, Hk, K, V, C = shape
    args = [x.float() for x in inputs(B, T, H, Hk, K, V, seed=T + 3)]
    return args, grads_of(lambda *a: kernels.loglinear_mamba2(*a, chunk_size=C, config=LaunchConfig(block_levels=1)), args)


@pytest.mark.parametrize("variant", GRAD_VARIANTS)
@pytest.mark.parametrize("shape", GRAD_SHAPES)
def test_backward_variants_give_the_default_gradients(shape, variant):
    """fp32: dq, dk summed over the head groups inside the kernels (or no groups: one program per chunk for every
    head), d log_decay's reverse cumulative sum in two levels (inside each chunk, then over the chunks), the
    forward's decay sums by kernels and the per-chunk gradients by one kernel (``fused_grads``: dk's shares summed
    by the last kernel) give the default's o and gradients, to fp32 round-off (the order of the head groups' sum
    or of the decay's sums differs)."""
    args, (ref, ref_grads) = default_grads(GRAD_SHAPES[shape])
    config = LaunchConfig(block_levels=1, **GRAD_VARIANTS[variant])
    out, grads = grads_of(lambda *a: kernels.loglinear_mamba2(*a, chunk_size=GRAD_SHAPES[shape][-1], config=config), args)
    assert_close(out.double(), ref.double(), rtol=1e-6, what=f"{variant}: o")
    for name, a, b in zip(("dq", "dk", "dv", "dlevel_scales", "dlog_decay"), grads, ref_grads):
        assert_close(a.double(), b.double(), rtol=1e-6, what=f"{variant}: {name}")


@pytest.mark.parametrize("T, C", [(50, 16), (10, 32), (64, 16)], ids=["T50-off-the-grid", "T10-below-a-chunk", "T64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decay_sums_in_kernels_match_the_host_sums(T, C, dtype):
    """gc (within-chunk sums) and gend (fp64 sums to each chunk's end) by the two small kernels equal PyTorch's scans
    to the round-off of another order of addition, padded tokens decaying by nothing; log_decay read through its
    strides (here a transposed view)."""
    B, H = 2, 3
    g = (-0.5 * torch.rand(B, H, T, generator=torch.Generator().manual_seed(T))).to(DEVICE, dtype).transpose(1, 2)
    host = chunk_decay(g, B, T, H, C, g.device, dtype)
    kernel = chunk_decay(g, B, T, H, C, g.device, dtype, in_kernels=True)
    for name, a, b in zip(("gc", "gend"), kernel, host):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert_close(a.double(), b.double(), rtol=1e-6 if dtype == torch.float32 else 1e-14, what=name)


@pytest.mark.skipif(DEVICE != "cpu", reason="counts the interpreter's allocations")
def test_backward_sums_in_kernels_hold_no_more_memory():
    """With the head groups' shares summed inside the kernels, dk's shares live on until the dq kernel has summed
    them, next to dq's shares and dλ. The node gradients' moment stays the larger one when, per token, their
    ``H·K·V / C`` fp32 numbers are twice a share's bytes, as in the benchmark (bf16 shares, ``H·K`` of them, and
    ``V = C``); fp32 shares here, so ``V = 2C``."""
    B, T, H, K, V, C = 1, 64, 2, 32, 32, 16
    q, k, v, lam, g = (x.float() for x in inputs(B, T, H, 1, K, V))
    gc, gend = chunk_decay(g, B, T, H, C, q.device)
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(3))
    peaks = []
    for config in (LaunchConfig(block_levels=1), LaunchConfig(block_levels=1, grad_sums_in_kernels=True)):
        _, tree = loglinear_forward(q, k, v, lam, gc, gend, C, config)
        peaks.append(peak_new_bytes(lambda: loglinear_backward(q, k, v, lam, gc, gend, tree, do, C, config)))
    assert peaks[1] <= peaks[0], peaks


def test_launch_knobs_are_checked():
    with pytest.raises(ValueError, match="tree_key_split must be a power of two"):
        LaunchConfig(tree_key_split=3)
    with pytest.raises(ValueError, match="at most 6 levels"):
        LaunchConfig(tree_registers=True, tree_block_levels=7)
    assert LaunchConfig(tree_key_split=8).key_split(32) == (2 if interpreted() else 1)  # tiles >= 16 (64 on a GPU)
    assert LaunchConfig(grad_head_group=4).grad_group(6) == 3 and LaunchConfig(head_group=2).grad_group(6) == 2
    with pytest.raises(ValueError, match="grad_warps must be None or a power of two"):
        LaunchConfig(grad_warps=6)
    with pytest.raises(ValueError, match="grad_stages must be None or an integer"):
        LaunchConfig(grad_stages=0)
    with pytest.raises(ValueError, match="fused_grads must be True or False, got 1"):
        LaunchConfig(fused_grads=1)
    with pytest.raises(ValueError, match="choose one"):
        LaunchConfig(fused_grads=True, node_grads_in_blocks=True)
    assert LaunchConfig(num_warps=4, tree_warps=2).grad_launch() == {"num_warps": 4}
    assert LaunchConfig(tree_warps=2, grad_stages=1).grad_launch(node_grads=True) == {"num_warps": 2, "num_stages": 1}
    assert LaunchConfig(grad_warps=8, node_grad_warps=16).grad_launch(node_grads=True)["num_warps"] == 16


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of"):
        LaunchConfig(precision="best")


@pytest.mark.slow
def test_vmap_folds_the_mapped_dimension_into_the_batch():
    """``vmap`` over a stack of M problems (the training ensemble's case), some inputs mapped and some
    shared, equals a loop over the members — output and every gradient."""
    from torch.func import vmap

    M, B, T, H, K, V = 3, 2, 70, 2, 8, 5
    q, k, v, lam, g = inputs(M * B, T, H, 1, K, V, seed=5, dtype=torch.float32)
    q, v, g = (x.unflatten(0, (M, B)) for x in (q, v, g))  # mapped: q, v, log decay; shared: k[:B], λ[:B]
    k, lam = k[:B], lam[:B]
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v, lam, g)]
    weights = torch.randn(M, B, T, H, V, generator=torch.Generator().manual_seed(0)).to(q)

    def call(q_, k_, v_, lam_, g_):
        return kernels.loglinear_mamba2(q_, k_, v_, lam_, g_, chunk_size=16)

    out = vmap(call, in_dims=(0, None, 0, None, 0))(*leaves)
    grads = torch.autograd.grad((out * weights).sum(), leaves)
    loop = [x.detach().requires_grad_(True) for x in (q, k, v, lam, g)]
    ref = torch.stack([call(loop[0][m], loop[1], loop[2][m], loop[3], loop[4][m]) for m in range(M)])
    ref_grads = torch.autograd.grad((ref * weights).sum(), loop)
    assert_close(out.double(), ref.double(), rtol=1e-6, what="vmap: o")
    for name, a, b in zip(("dq", "dk", "dv", "dlevel_scales", "dlog_decay"), grads, ref_grads):
        assert_close(a.double(), b.double(), rtol=1e-6, atol=1e-6, what=f"vmap: {name}")


def test_the_public_form_and_wide_heads():
    """``loglinear_attention(form="triton")``; K = 130 and V = 131 cross the 128-column blocks."""
    args = inputs(1, 20, 2, 1, 130, 131, seed=3)
    check_against_float64(
        lambda *a: le.loglinear_attention(*a, form="triton", chunk_size=16),
        lambda *a: le.loglinear_attention(*a, form="chunkwise"),
        args, rtol=2e-6, what="form='triton', K=130, V=131",
    )


def test_float64_is_exact_and_no_decay_works():
    """fp64 (the interpreter's dots are exact) agrees to rounding; log_decay=None is plain log-linear attention."""
    q, k, v, lam, _ = inputs(1, 77, 2, 1, 4, 4, seed=5)
    out = le.loglinear_attention(q, k, v, lam, form="triton", chunk_size=16)
    assert_close(out, le.loglinear_attention(q, k, v, lam, form="naive"), rtol=1e-12, what="fp64, no decay")


def test_unit_level_scales_give_the_step1_mamba2_kernel():
    """λ ≡ 1: the log-linear kernels compute Mamba-2, as the first rung of the ladder does."""
    q, k, v, lam, g = (x.float() for x in inputs(1, 100, 2, 1, 8, 8, seed=6))
    out = le.loglinear_attention(q, k, v, torch.ones_like(lam), g, form="triton", chunk_size=16)
    assert_close(out.double(), mamba2_triton(q, k, v, g, chunk_size=16).double(), rtol=2e-6, what="λ ≡ 1")


def test_fp32_calls_keep_narrow_tiles_and_multiply_as_torch_matmul_does():
    """Head tiles of fp32 and fp64 calls are as narrow as 16 wherever the kernels run; fp32 products are exact, or
    tf32 while ``torch.backends.cuda.matmul.allow_tf32`` is set; fp64 products are always exact."""
    from loglin_edu.kernels.config import dot_precision, head_block

    assert [head_block(n, torch.float32) for n in (16, 24, 200)] == [16, 32, 256] and head_block(8, torch.float64) == 16
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert dot_precision(torch.float32) == "ieee" and dot_precision(torch.float64) == "ieee"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert dot_precision(torch.float32) == "tf32" and dot_precision(torch.float64) == "ieee"
        assert dot_precision(torch.bfloat16, "exact") == "tf32x3"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_triton_form_is_offered_for_every_model():
    """Every linear model and its log-linear version takes ``form="triton"`` and computes what its chunkwise form
    does; on the CPU a call without a form takes the chunkwise one."""
    q, k, v, lam, g = (x.float() for x in inputs(1, 16, 2, 2, 4, 4))
    beta = torch.rand(g.shape, generator=torch.Generator().manual_seed(3)).to(g)
    assert "triton" in le.ops.forms()
    calls = {"Mamba-2": lambda form: le.mamba2_attention(q, k, v, g, form=form, chunk_size=16),
             "Gated DeltaNet": lambda form: le.gated_deltanet_attention(q, k, v, g, beta, form=form, chunk_size=16),
             "log-linear Mamba-2": lambda form: le.loglinear_attention(q, k, v, lam, g, form=form, chunk_size=16),
             "log-linear Gated DeltaNet": lambda form: le.loglinear_attention(q, k, v, lam, g, beta, form=form,
                                                                              chunk_size=16)}
    for name, call in calls.items():
        assert_close(call("triton"), call("chunkwise"), rtol=1e-5, what=name)
    assert le.loglinear_attention(q, k, v, lam, g).shape == v.shape  # form=None: chunkwise on the CPU


@pytest.mark.parametrize("decay", [True, False])
def test_mamba2_triton_form_equals_the_chunkwise_form(decay):
    """``mamba2_attention(form="triton")`` (step 1's kernel through the registry): output, gradients and the prefill
    state of the chunkwise form, with q, k shared by the heads and T not a multiple of the chunk."""
    q, k, v, _, g = (x.double() for x in inputs(2, 45, 3, 1, 8, 4, seed=11))
    g = g if decay else None
    args = [x.requires_grad_() for x in (q, k, v, g) if x is not None]
    fill = lambda *a: a if decay else (*a, None)  # noqa: E731

    def run(form):
        out = le.mamba2_attention(*fill(*args), form=form, chunk_size=16)
        return [out, *torch.autograd.grad(out, args, torch.cos(out))]

    for ours, ref in zip(run("triton"), run("chunkwise"), strict=True):
        assert_close(ours, ref, rtol=1e-10, what="fp64")
    _, state = le.ops.mix(*fill(*args), form="triton", chunk_size=16, return_state=True)
    _, ref_state = le.ops.mix(*fill(*args), form="chunkwise", chunk_size=16, return_state=True)
    assert_close(state.double(), ref_state, rtol=1e-6, what="prefill state (fp32)")


def test_kernel_operators_pass_torch_opcheck():
    """Steps 1 and 5 are PyTorch custom operators (so that ``torch.compile`` keeps them in one graph): their
    schemas, shapes without data (what a compiled graph is traced with), registered gradients and vmap rules pass
    ``torch.library.opcheck``."""
    from loglin_edu.kernels import step1_mamba2_chunked as step1

    q, k, v, lam, g = (x.float().requires_grad_() for x in inputs(2, 40, 2, 1, 8, 8, seed=13))
    torch.library.opcheck(step1.mamba2_chunked, (q, k, v, g, 16))
    torch.library.opcheck(step1.mamba2_chunked, (q, k, v, None, 16))
    torch.library.opcheck(kernels.loglinear_mamba2_forward, (q, k, v, lam, g, 16, kernels.CONFIG_NAME, True))


@pytest.mark.parametrize("name", ["mamba2", "loglinear_mamba2"])
def test_a_compiled_ensemble_on_the_kernels_is_one_graph(name):
    """``torch.compile`` traces a vmapped ensemble of layers on their kernels (``backend="triton"``) as one graph: the
    kernels are operators, not graph breaks, and nothing else the layers call breaks it (a graph break leaves the
    work around it uncompiled)."""
    from loglin_edu.layers import ModelConfig, build_model
    from loglin_edu.train.ensemble import Ensemble

    config = ModelConfig(name, vocab_size=32, d_model=16, max_len=64, mixer_options=dict(backend="triton", chunk_size=16))
    ensemble = Ensemble([build_model(config) for _ in range(2)])
    tokens = torch.randint(0, 32, (2, 3, 64), generator=torch.Generator().manual_seed(0))
    explained = torch._dynamo.explain(lambda t: ensemble(t).square().mean())(tokens)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_mamba2_triton_form_runs_inside_vmap():
    """Its vmap rule folds the mapped dimension into the batch: the ensemble's members in one launch, the same
    outputs and gradients as one call per member."""
    q, k, v, _, g = (x.double() for x in inputs(3, 40, 2, 1, 8, 8, seed=12))  # 3 members of batch 1
    stacked = [x[:, None].requires_grad_() for x in (q, k, v, g)]
    mapped = torch.func.vmap(lambda *a: le.ops.mix(*a, form="triton", chunk_size=16))(*stacked)
    grads = torch.autograd.grad(mapped, stacked, torch.sin(mapped))
    for m in range(3):
        one = [x[m].detach().requires_grad_() for x in stacked]
        out = le.ops.mix(*one, form="triton", chunk_size=16)
        assert_close(mapped[m], out, rtol=1e-10, what=f"member {m}")
        for a, b in zip(grads, torch.autograd.grad(out, one, torch.sin(out)), strict=True):
            assert_close(a[m], b, rtol=1e-10, what=f"member {m} gradient")


# --- guard bands -----------------------------------------------------------------------------------


GUARD_CONFIGS = {
    "default": LaunchConfig(head_group=3, block_levels=1),
    "variants": LaunchConfig(head_group=3, block_levels=1, tree_registers=True, upper_row_split=2, grad_head_group=1,
                             grad_sums_in_kernels=True),
    "fused": LaunchConfig(head_group=3, block_levels=1, grad_head_group=1, grad_sums_in_kernels=True, fused_grads=True),
}


@pytest.mark.parametrize("launch", GUARD_CONFIGS)
@pytest.mark.parametrize("shared", [True, False])
def test_guard_bands_no_read_or_write_out_of_bounds(shared, launch):
    """Inputs and outputs are views into NaN-padded buffers: a read outside an input would bring NaN into
    the results, a write outside an output would overwrite a NaN of its pad."""
    B, T, H, K, V, C = 2, 45, 3, 5, 6, 16
    Hk = 1 if shared else H
    config = GUARD_CONFIGS[launch]
    dense = [x.float() for x in inputs(B, T, H, Hk, K, V, seed=7)]
    views = [padded_copy(x)[1] for x in dense]
    q, k, v, lam, g = views
    gc, gend = chunk_decay(g, B, T, H, C, q.device)
    o_buffer, o = padded_view((B, T, H, V))
    _, tree = loglinear_forward(q, k, v, lam, gc, gend, C, config, out=o)
    buffers = {name: padded_view(shape) for name, shape in
               [("dv", (B, T, H, V)), ("dlam", tuple(lam.shape)), ("dlog_decay", (B, T, H))]
               + ([] if shared else [("dq", (B, T, H, K)), ("dk", (B, T, H, K))])}
    buffers["dlam"][1].zero_()
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    grads = loglinear_backward(q, k, v, lam, gc, gend, tree, do, C, config,
                               grads={name: view for name, (_, view) in buffers.items()})
    assert guard_intact(o_buffer) and all(guard_intact(buf) for buf, _ in buffers.values())
    ref_out, ref_tree = loglinear_forward(*dense[:4], gc, gend, C, config)
    ref_grads = loglinear_backward(*dense[:4], gc, gend, ref_tree, do, C, config)
    assert torch.equal(o, ref_out)
    for got, want in zip(grads, ref_grads):
        assert torch.isfinite(got).all() and torch.equal(got, want.to(got.dtype))  # d log_decay: fp64 unless given


# --- the benchmark's CPU tier ----------------------------------------------------------------------


def test_benchmark_cpu_tier(tmp_path):
    from loglin_edu.bench.__main__ import main
    from loglin_edu.bench.settings import CPU, counted_work

    result = main(["--tier", "cpu", "--lengths", "32", "--quiet", "--out", str(tmp_path / "b.json")])
    rows = {r["name"]: r for r in result["rows"]}
    assert all("forward_backward_ms" in r for r in rows.values()), rows
    assert (tmp_path / "b.json").exists() and (tmp_path / "b.png").exists() and result["complete"]
    work = counted_work(4, 32, CPU)
    assert work["forward_flops"] > 0 and rows["loglinear (ours, triton)"]["floor_forward_backward_ms"] > 0


@pytest.mark.slow
def test_benchmark_precision_ladder_cpu_tier(tmp_path):
    from loglin_edu.bench.__main__ import main
    from loglin_edu.kernels.config import PRECISIONS

    result = main(["--tier", "cpu", "--precision", "--lengths", "32", "--quiet", "--out", str(tmp_path / "p.json")])
    assert [r["precision"] for r in result["precision"]] == list(PRECISIONS)
    for row in result["precision"]:
        assert "forward_backward_ms" in row and max(row["errors"].values()) < 1e-5, row  # fp32 on the CPU tier
