"""Log-linear attention: ``O = (A ⊙ M^S ⊙ M^H) V`` in three forms that compute the same function.

``A`` and ``M^S`` are those of the underlying linear model (linear attention, Mamba-2's decay, Gated
DeltaNet's delta rule); ``M^H[t, s] = λ[t, level(t, s)]`` weights every Fenwick bucket of query ``t``.

- ``naive``:     the dense ``T × T`` matrices: O(T²) time and memory.
- ``recurrent``: token by token with a :class:`~loglin_edu.state.FenwickState`: O(log T) states.
- ``chunkwise``: the chunk scan of :mod:`loglin_edu.chunk_scan`: O(T log T), no ``T × T`` tensor.

The forms are heads-first (``[B, H, T, D]``). The public operator
:func:`~loglin_edu.ops.loglinear_attention` checks its ``[B, T, H, D]`` inputs and dispatches to them,
and to the Triton kernels of :mod:`loglin_edu.kernels` (``form="triton"``).

``level_scales ≡ 1`` recovers the linear model exactly.

With ``return_state=True`` every form also returns the decoding state after the sequence (a
:class:`~loglin_edu.state.FenwickState`), so decoding continues where a prefill stopped: the recurrent
form returns the state it stepped, the chunkwise form the chunk scan's, the naive form builds it from
its definition (:func:`~loglin_edu.state.prefix_state`).
"""

from __future__ import annotations

import torch

from .deltanet import delta_attention_matrix
from .linear import decay_attention_matrix
from .masks import hierarchical_mask
from .state import FenwickState, prefix_state


def recurrent_loglinear(q, k, v, level_scales, log_decay=None, beta=None, return_state=False):
    """Token-by-token log-linear attention through a :class:`FenwickState`, heads-first.

    q, k: ``[B, H, T, K]``; v: ``[B, H, T, V]``; level_scales: ``[B, H, T, L]``; log_decay, beta:
    ``[B, H, T]`` or None. Returns ``[B, H, T, V]``, and with ``return_state`` the state it stepped.
    """
    state = FenwickState()
    outputs = []
    for t in range(q.shape[2]):
        outputs.append(
            state.step(
                q[:, :, t], k[:, :, t], v[:, :, t], level_scales[:, :, t],
                None if log_decay is None else log_decay[:, :, t],
                None if beta is None else beta[:, :, t],
            )
        )
    out = torch.stack(outputs, dim=2)
    return (out, state) if return_state else out


def naive_loglinear(q, k, v, level_scales, log_decay=None, beta=None, return_state=False):
    """``(A ⊙ M^S ⊙ M^H) V`` with dense masks, heads-first (shapes as :func:`recurrent_loglinear`); with
    ``return_state`` also the state after the sequence, from its definition (:func:`prefix_state`)."""
    if beta is None:
        matrix = decay_attention_matrix(q, k, log_decay)
    else:
        matrix = delta_attention_matrix(q, k, log_decay, beta)
    out = (matrix * hierarchical_mask(level_scales.transpose(1, 2))) @ v
    return (out, prefix_state(k, v, log_decay, beta)) if return_state else out
