"""Triton kernels for log-linear attention, installed as ``loglin_edu.kernels``.

Triton is imported lazily, by the modules of this package only: ``import loglin_edu`` never needs
triton or a GPU. Without CUDA the kernels run under Triton's interpreter, which needs
``TRITON_INTERPRET=1`` in the environment before the kernels are defined: importing this package on a
machine without CUDA sets it (unless it is already set), so do that before importing triton yourself.

The ladder, one file per step, each checked against the step before and against the package's forms:

1. :mod:`~loglin_edu.kernels.mamba2_chunked` — chunked Mamba-2 (linear attention with scalar decay):
   one program walks the chunks of one head, its ``K × V`` state in registers. Forward and backward.
2. :mod:`~loglin_edu.kernels.intra_chunk` — the log-linear intra-chunk product: the ``C × C`` level
   pattern ``λ[i, level(i, j)]`` applied inside a chunk (levels ``0..log2 C``).
3. :mod:`~loglin_edu.kernels.chunk_tree` — the inter-chunk levels: a Fenwick tree of ``K × V`` states
   over chunks, built in ``O(log N)`` depth, and the output kernel that reads one node per level.
4. :mod:`~loglin_edu.kernels.backward` — the backward kernels: node gradients, then ``dq, dλ`` and
   ``dk, dv``; ``d log_decay`` from a reverse cumulative sum.
5. :mod:`~loglin_edu.kernels.loglinear_mamba2` — the ``torch.autograd.Function`` behind
   ``loglinear_attention(..., form="triton")``.
"""

from __future__ import annotations

import os
import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def interpreted() -> bool:
    """Whether the kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
