"""Step 11, the intra-chunk product ``(P ⊙ Λ) V`` as one operator, on the CPU under Triton's interpreter.

Against the chunk scan's PyTorch expression (:func:`loglin_edu.chunk_scan.intra_chunk_scales`) in float64, the
product and every gradient; 16-bit inputs; strided views and reads that stay inside their tensors; vmap and
``torch.library.opcheck``. The chunk scan that uses it is checked whole in ``test_kernels_delta_factors.py``.
"""

import pytest
import torch

from kernel_helpers import DEVICE, grads_of, padded_copy
from operators import assert_close

step11 = pytest.importorskip("loglin_edu.kernels.step11_level_intra_op")

from loglin_edu.chunk_scan import intra_chunk_scales  # noqa: E402
from loglin_edu.kernels import interpreted  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
if DEVICE == "cpu" and not interpreted():
    pytest.skip("TRITON_INTERPRET=1 must be set before triton is imported", allow_module_level=True)


def inputs(B, H, N, C, L, V, seed=0, dtype=torch.float64):
    """P ``[B, H, N, C, C]`` (lower triangular, as the chunk blocks are), λ ``[B, H, N, C, L]`` in (0.5, 1.5) and v
    ``[B, H, N, C, V]``, the last two as strided views of time-first tensors (as the chunk scan passes them)."""
    gen = torch.Generator().manual_seed(seed)
    intra = torch.randn(B, H, N, C, C, generator=gen).tril()
    lam = (0.5 + torch.rand(B, N, C, H, L, generator=gen)).permute(0, 3, 1, 2, 4)
    v = torch.randn(B, N, C, H, V, generator=gen).permute(0, 3, 1, 2, 4)
    return [x.to(DEVICE, dtype) for x in (intra, lam, v)]


def by_pytorch(intra, lam, v):
    return (intra * intra_chunk_scales(lam, intra.shape[-1])) @ v


@pytest.mark.parametrize("B, H, N, C, L, V", [(2, 2, 3, 16, 5, 24), (1, 3, 2, 32, 9, 80), (2, 1, 2, 64, 7, 64)],
                         ids=["C16-five-levels", "C32-two-value-tiles", "C64-only-its-levels"])
def test_the_product_and_its_gradients_match_float64(B, H, N, C, L, V):
    """dλ is the sum over each level's pairs at levels ``0..log2 C`` and zero above (the chunk scan's reads
    across chunks use those)."""
    args = inputs(B, H, N, C, L, V)
    out, grads = grads_of(step11.level_intra_triton, args)
    ref, ref_grads = grads_of(by_pytorch, args)
    assert_close(out, ref, what="(P ⊙ Λ) V")
    for name, a, b in zip(("dP", "dλ", "dv"), grads, ref_grads):
        assert_close(a, b, what=name)
    assert not grads[1][..., C.bit_length():].any()


def test_float32_inputs_give_float32_outputs_near_float64():
    args = inputs(1, 2, 2, 32, 8, 40, seed=1)
    out, grads = grads_of(step11.level_intra_triton, [x.float() for x in args])
    ref, ref_grads = grads_of(by_pytorch, args)
    assert out.dtype == torch.float32
    assert_close(out.double(), ref, rtol=1e-5, what="(P ⊙ Λ) V")
    for name, a, b in zip(("dP", "dλ", "dv"), grads, ref_grads):
        assert_close(a.double(), b, rtol=1e-5, what=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_give_16_bit_outputs_rounded_once(dtype):
    """16-bit inputs are multiplied in fp32 and the product and gradients rounded once to the inputs' type: within
    one unit of that type's rounding (in norm) of the float64 result for the same rounded inputs."""
    args = [x.to(dtype) for x in inputs(1, 2, 2, 32, 8, 40, seed=2)]
    out, grads = grads_of(step11.level_intra_triton, args)
    ref, ref_grads = grads_of(by_pytorch, [x.double() for x in args])
    rtol = torch.finfo(dtype).eps
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert_close(out.double(), ref, rtol=rtol, what="(P ⊙ Λ) V")
    for name, a, b in zip(("dP", "dλ", "dv"), grads, ref_grads):
        assert_close(a.double(), b, rtol=rtol, what=name)


def test_reads_and_writes_stay_inside_their_tensors():
    """Inputs in NaN-padded buffers: a read outside brings NaN in, and the outputs must equal those of contiguous
    copies."""
    args = [x.float() for x in inputs(1, 2, 2, 16, 6, 20, seed=2)]
    padded = [padded_copy(x)[1] for x in args]
    d_out = torch.randn(args[2].shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    precision = step11.factor_precision(torch.float32)
    out = step11.level_intra_product(*padded, precision)
    grads = step11.level_intra_product_backward(*padded, padded_copy(d_out)[1], precision)
    assert_close(out, step11.level_intra_product(*(x.contiguous() for x in args), precision), rtol=0, atol=0,
                 what="o")
    for name, a, b in zip(("dP", "dλ", "dv"), grads, step11.level_intra_product_backward(
            *(x.contiguous() for x in args), d_out, precision)):
        assert_close(a, b, rtol=0, atol=0, what=name)


def test_the_operator_runs_inside_vmap():
    """Its vmap rule folds the mapped dimension into the batch (one output tensor, no tuple): the same output and
    gradients as one call per member."""
    stacked = [x[:, None].requires_grad_() for x in inputs(3, 2, 2, 16, 6, 12, seed=4)]  # 3 members of batch 1
    mapped = torch.func.vmap(step11.level_intra_triton)(*stacked)
    grads = torch.autograd.grad(mapped, stacked, torch.sin(mapped))
    for m in range(3):
        single = [x[m].detach().requires_grad_() for x in stacked]
        out = step11.level_intra_triton(*single)
        assert_close(mapped[m], out, what=f"member {m}: o")
        for a, b in zip(grads, torch.autograd.grad(out, single, torch.sin(out))):
            assert_close(a[m], b, what=f"member {m}: a gradient")


def test_the_operator_passes_torch_opcheck():
    """Schema, shapes without data, the registered gradient and the vmap rule (``torch.library.opcheck``)."""
    args = [x.float().requires_grad_() for x in inputs(2, 2, 2, 16, 6, 12, seed=5)]
    torch.library.opcheck(step11.level_intra_product, (*args, step11.factor_precision(torch.float32)))


def test_chunk_sizes_and_level_counts_the_kernels_do_not_take_are_refused():
    intra, lam, v = inputs(1, 1, 1, 16, 5, 8)
    with pytest.raises(ValueError, match="powers of two >= 16"):
        step11.level_intra_triton(intra[..., :12, :12], lam[..., :12, :], v[..., :12, :])
    with pytest.raises(ValueError, match="at least log2"):
        step11.level_intra_triton(intra, lam[..., :4], v)
