"""Triton kernels for log-linear attention, installed as ``loglin_edu.kernels``.

Triton is imported by the modules of this package only, never by ``import loglin_edu``. Without CUDA the
kernels run under Triton's interpreter, which reads ``TRITON_INTERPRET=1`` from the environment when
triton is first imported: set it yourself before anything imports triton (the tests and the book's
chapters do), e.g. ``os.environ["TRITON_INTERPRET"] = "1"``. This package never changes the environment.

The ladder, one file per step, each checked against the step before and against the package's forms:

1. :mod:`~loglin_edu.kernels.step1_mamba2_chunked` — chunked Mamba-2 (linear attention with scalar decay):
   one program walks the chunks of one head, its ``K × V`` state in registers. Forward and backward, one
   PyTorch custom operator (``mamba2_attention(..., form="triton")``).

   1b. :mod:`~loglin_edu.kernels.step1b_mamba2_parallel` — the same function without the long walk: blocks of
   chunks walked in parallel, their states passed on by a short scan (Mamba-2's state passing); the
   backward mirrors it. Its time does not grow with ``T`` at a fixed number of tokens (step 1's does).
2. :mod:`~loglin_edu.kernels.step2_intra_chunk` — the log-linear intra-chunk product: the ``C × C`` level
   pattern ``λ[i, level(i, j)]`` applied inside a chunk (levels ``0..log2 C``).
3. :mod:`~loglin_edu.kernels.step3_chunk_tree` — the inter-chunk levels: a Fenwick tree of ``K × V`` states
   over chunks, built in ``O(log N)`` depth, and the output kernel that reads one node per level.
4. :mod:`~loglin_edu.kernels.step4_tree_backward` — the backward through the tree: node gradients, then
   ``dk, dv`` and ``dq, dλ``; ``d log_decay`` from a reverse cumulative sum.
5. :mod:`~loglin_edu.kernels.step5_loglinear_mamba2` — the PyTorch custom operator behind
   ``loglinear_attention(..., form="triton")`` (steps 3 and 4 as its forward and gradient), for any shapes, inside
   ``torch.func.vmap`` and as one node of a ``torch.compile`` graph.

The delta rule (log-linear Gated DeltaNet) climbs the same ladder from step 6, its transition a matrix:

6. :mod:`~loglin_edu.kernels.step6_delta_chunks` — the WY/UT factors of every chunk (``T_β``, ``W``, ``U₀``,
   the query side, the intra-chunk block), one program per chunk.
7. :mod:`~loglin_edu.kernels.step7_delta_levels` — the chunk levels: one walk per level and aligned block,
   carrying the block's left half through the transitions of every chunk of its right half; the output.
8. :mod:`~loglin_edu.kernels.step8_delta_backward` — reverse walks of the adjoints, per-chunk level
   gradients, and the backward of the WY form.
9. :mod:`~loglin_edu.kernels.step9_loglinear_gated_deltanet` — the ``torch.autograd.Function`` behind
   ``loglinear_attention(..., beta=..., form="triton")``, with a vmap rule.
10. :mod:`~loglin_edu.kernels.step10_delta_factors_op` — step 6's WY factors as one PyTorch custom operator with a
    backward kernel of the same shape, for the chunkwise forms: ``gated_deltanet_attention(..., form="triton")``,
    and log-linear Gated DeltaNet's chunk scan where ``torch.compile`` traces its Triton form (step 9's Function
    would split the graph).
11. :mod:`~loglin_edu.kernels.step11_level_intra_op` — that chunk scan's intra-chunk product ``(P ⊙ Λ) V`` as one
    custom operator, ``Λ`` built in registers as in step 2, and its backward (``dP``, ``dλ``, ``dV``) in one kernel.

Decoding: :mod:`~loglin_edu.kernels.decode_step` — one token of log-linear Mamba-2 for a batch in one launch
(the decay and the read of every Fenwick level, the token's own level 0 read from it, and the binary-counter
carry), in place on a :class:`~loglin_edu.decoding.FenwickCache` buffer.

Shared by the steps: :mod:`~loglin_edu.kernels.tiles` (the Triton helpers: tiles in and out, the decay and
level patterns of a chunk), :mod:`~loglin_edu.kernels.inputs` (the decay's prefix sums, prepared before the
kernels that read them) and :mod:`~loglin_edu.kernels.config` (tile widths, the precision ladder,
:class:`LaunchConfig`, :class:`LinearLaunchConfig` and :class:`DeltaLaunchConfig`).
"""

from __future__ import annotations

import os

from .config import DeltaLaunchConfig, LaunchConfig, LinearLaunchConfig

__all__ = ["DeltaLaunchConfig", "LaunchConfig", "LinearLaunchConfig", "check_device", "interpreted"]


def interpreted() -> bool:
    """Whether the kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(x) -> None:
    """Raise unless the kernels can run on ``x`` (a tensor): it is on a GPU, or triton is in interpreter mode."""
    if not x.is_cuda and not interpreted():
        raise RuntimeError(
            "the Triton kernels got CPU tensors but triton is not in interpreter mode: set TRITON_INTERPRET=1 in the "
            "environment before triton is first imported (os.environ['TRITON_INTERPRET'] = '1')"
        )
