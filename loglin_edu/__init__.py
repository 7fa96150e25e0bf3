"""loglin_edu: log-linear attention, from softmax attention to the chunk-scan algorithm.

Every operator takes ``[B, T, H, D]`` tensors and a ``form`` that picks an algorithm; all forms of an
operator compute the same function. Importing this package never needs triton or a GPU.
"""

from . import chunk_scan, chunking, decoding, deltanet, fenwick, ledger, linear, loglinear, masks, recurrence, softmax, state
from .decoding import FenwickCache
from .deltanet import gated_deltanet_attention
from .fenwick import bucket, buckets, level, level_matrix, num_levels
from .ledger import Ledger, compare_forms
from .linear import linear_attention, mamba2_attention
from .loglinear import loglinear_attention
from .masks import causal_mask, decay_mask, hierarchical_mask, loglinear_mask
from .softmax import softmax_attention
from .state import FenwickState

for _operator, _forms in (
    (softmax_attention, softmax.FORMS),
    (linear_attention, linear.FORMS),
    (mamba2_attention, linear.FORMS),
    (gated_deltanet_attention, deltanet.FORMS),
    (loglinear_attention, loglinear.REFERENCE_FORMS),  # every variant; loglinear.FORMS adds "triton"
):
    _operator.forms = _forms

__version__ = "0.1.0"

__all__ = [
    "FenwickCache",
    "FenwickState",
    "Ledger",
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
