"""loglin_edu: log-linear attention, from softmax attention to the chunk-scan algorithm.

Every operator takes ``[B, T, H, D]`` tensors and a ``form`` that picks an algorithm; all forms of an
operator compute the same function (:mod:`loglin_edu.ops` holds the operators and their forms). Importing this package never needs triton or a GPU.
"""

from . import chunk_scan, chunking, decoding, deltanet, fenwick, ledger, linear, loglinear, masks, ops, recurrence, softmax, state
from .decoding import FenwickCache
from .fenwick import bucket, buckets, level, level_matrix, num_levels
from .ledger import Ledger, compare_forms
from .masks import causal_mask, decay_mask, hierarchical_mask, loglinear_mask
from .ops import (
    REFERENCE_FORMS,
    gated_deltanet_attention,
    linear_attention,
    loglinear_attention,
    mamba2_attention,
    softmax_attention,
)
from .state import FenwickState

__version__ = "0.1.0"

__all__ = [
    "FenwickCache",
    "FenwickState",
    "Ledger",
    "REFERENCE_FORMS",
    "bucket",
    "buckets",
    "causal_mask",
    "compare_forms",
    "decay_mask",
    "gated_deltanet_attention",
    "hierarchical_mask",
    "level",
    "level_matrix",
    "linear_attention",
    "loglinear_attention",
    "loglinear_mask",
    "mamba2_attention",
    "num_levels",
    "softmax_attention",
]
