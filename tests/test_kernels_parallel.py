"""Step 1b of the kernel ladder (chunk-parallel linear Mamba-2) under Triton's interpreter (TRITON_INTERPRET=1,
set in conftest.py): fp32 with exact dots against the step-1 kernels and the package's float64 form, on o and every
gradient; shapes off every grid (T off the chunks and blocks, T < C, K and V not multiples of the tiles, keys in
several blocks); guard bands around the inputs. Chunks of 16 tokens and blocks of a few chunks make several blocks
out of a few dozen tokens.
"""

import pytest
import torch

import loglin_edu as le
from kernel_helpers import DEVICE, grads_of, padded_copy
from operators import assert_close

kernels = pytest.importorskip("loglin_edu.kernels.step1b_mamba2_parallel")

from loglin_edu.kernels import interpreted  # noqa: E402
from loglin_edu.kernels.config import LinearLaunchConfig  # noqa: E402
from loglin_edu.kernels.step1_mamba2_chunked import mamba2_triton  # noqa: E402
from loglin_edu.kernels.step1b_mamba2_parallel import mamba2_triton_parallel  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy's, from inside the interpreter
if DEVICE == "cpu" and not interpreted():
    pytest.skip("TRITON_INTERPRET=1 must be set before triton is imported", allow_module_level=True)

NAMES = ("o", "dq", "dk", "dv", "dlog_decay")


def inputs(B, T, H, Hk, K, V, seed=0, decay=True):
    """float64 q, k ``[B, T, Hk, K]``, v ``[B, T, H, V]``, log decay ``[B, T, H]`` in (-0.5, 0] (or None)."""
    gen = torch.Generator().manual_seed(seed)
    x = [torch.randn(B, T, Hk, K, generator=gen), torch.randn(B, T, Hk, K, generator=gen),
         torch.randn(B, T, H, V, generator=gen), -0.5 * torch.rand(B, T, H, generator=gen) if decay else None]
    return [None if a is None else a.to(DEVICE, torch.float64) for a in x]


def fp32(args):
    return [None if a is None else a.float() for a in args]


def parallel(C, config):
    return lambda q, k, v, g: mamba2_triton_parallel(q, k, v, g, chunk_size=C, config=config)


def assert_all_close(got, want, rtol, what):
    """Output and gradients ``(o, grads)`` against ``(o, grads)``; the absolute floor covers d log_decay at T = 1
    (``q·dq - k·dk``, exactly zero in float64)."""
    for name, g, w in zip(NAMES, [got[0], *got[1]], [want[0], *want[1]]):
        assert_close(g.double(), w.double(), rtol=rtol, atol=1e-6, what=f"{what}: {name}")


CASES = [  # (B, T, H, Hk, K, V), C, block_chunks, key_split
    ((2, 70, 3, 1, 8, 5), 16, 2, 64),  # q, k shared; T off the chunk grid; N = 5 chunks: blocks of 2, 2 and 1
    ((1, 11, 2, 1, 8, 8), 16, 16, 64),  # T < C: one chunk, one block
    ((1, 90, 2, 2, 40, 24), 16, 2, 16),  # per-head q, k; K, V off the tiles; keys in four blocks of 16
    ((1, 70, 2, 1, 40, 24), 16, 1, 32),  # every chunk its own block; keys in two blocks
    ((1, 37, 2, 2, 20, 70), 32, 4, 64),  # T < one block
    ((1, 1, 1, 1, 3, 2), 16, 16, 64),
]


@pytest.mark.parametrize("shape, C, W, KS", CASES, ids=[f"T{c[0][1]}-W{c[2]}-KS{c[3]}" for c in CASES])
def test_step1b_equals_step1_and_the_float64_form(shape, C, W, KS):
    args = inputs(*shape)
    got = grads_of(parallel(C, LinearLaunchConfig(block_chunks=W, key_split=KS)), fp32(args))
    step1 = grads_of(lambda q, k, v, g: mamba2_triton(q, k, v, g, chunk_size=C), fp32(args))
    reference = grads_of(lambda q, k, v, g: le.mamba2_attention(q, k, v, g, form="naive"), args)
    assert got[0].dtype == torch.float32
    assert_all_close(got, reference, 2e-6, f"step 1b {shape}, against float64")
    assert_all_close(got, step1, 2e-6, f"step 1b {shape}, against step 1")


def test_step1b_without_decay():
    """log_decay None: linear attention, no gradient for the decay."""
    q, k, v, _ = inputs(1, 40, 2, 1, 8, 8, decay=False)
    out, grads = grads_of(parallel(16, LinearLaunchConfig(block_chunks=2)), fp32([q, k, v]) + [None])
    ref, ref_grads = grads_of(lambda q, k, v: le.mamba2_attention(q, k, v, None, form="naive"), [q, k, v])
    assert len(grads) == 3
    for name, g, r in zip(NAMES, [out, *grads], [ref, *ref_grads]):
        assert_close(g.double(), r, rtol=2e-6, atol=1e-6, what=f"no decay: {name}")


def test_step1b_splits_wide_keys_and_values():
    """K, V > 128: the wrapper sums over key blocks and concatenates value blocks."""
    args = inputs(1, 20, 1, 1, 136, 132)
    got = grads_of(parallel(16, LinearLaunchConfig(block_chunks=1)), fp32(args))
    reference = grads_of(lambda q, k, v, g: le.mamba2_attention(q, k, v, g, form="naive"), args)
    assert_all_close(got, reference, 1e-5, "K = 136, V = 132")


def test_step1b_reads_nothing_outside_its_inputs():
    """Inputs as views into NaN-padded buffers: a load outside a tensor would bring a NaN in."""
    args = fp32(inputs(2, 45, 2, 1, 12, 10))
    views = [padded_copy(a)[1] for a in args]
    config = LinearLaunchConfig(block_chunks=2, key_split=16)
    got = grads_of(parallel(16, config), views)
    want = grads_of(parallel(16, config), [a.contiguous() for a in args])
    for name, g, w in zip(NAMES, [got[0], *got[1]], [want[0], *want[1]]):
        assert torch.isfinite(g).all(), name
        assert torch.equal(g, w), name


def test_step1b_head_sum_adds_the_shares_in_order():
    """The shares of dq and dk summed over the heads in one launch: the fp32 sum, heads in order."""
    shares = torch.randn(2, 2, 9, 5, 12, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    dq, dk = kernels.sum_heads(shares, torch.float32)
    for got, share in zip((dq, dk), shares):
        want = share[:, :, 0:1].clone()
        for h in range(1, share.shape[2]):
            want += share[:, :, h : h + 1]
        assert torch.equal(got, want)


@pytest.mark.parametrize("field, value", [("block_chunks", 0), ("key_split", 24), ("key_split", 8)])
def test_linear_launch_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        LinearLaunchConfig(**{field: value})


def test_benchmark_times_step1b_under_its_launch_variants(tmp_path):
    """``--variants --linear`` times step 1b under each LinearLaunchConfig it is given (its own row beside step 1's
    is in the benchmark's CPU tier, test_kernels.py)."""
    from loglin_edu.bench.__main__ import main
    from loglin_edu.bench.implementations import BY_MODEL

    assert "mamba2 linear (ours, triton chunk-parallel)" in BY_MODEL["loglinear_mamba2"]
    result = main(["--tier", "cpu", "--variants", "--linear", "--lengths", "16", "--configs", "1,16,4,1",
                   "--quiet", "--out", str(tmp_path / "v.json")])
    [row] = result["variants"]
    assert (row["config"]["block_chunks"], row["config"]["key_split"]) == (1, 16)
    assert "forward_backward_ms" in row, row
