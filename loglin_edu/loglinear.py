"""Log-linear attention: ``O = (A ⊙ M^S ⊙ M^H) V`` in three forms that compute the same function.

``A`` and ``M^S`` are those of the underlying linear model (linear attention, Mamba-2's decay, Gated
DeltaNet's delta rule); ``M^H[t, s] = λ[t, level(t, s)]`` weights every Fenwick bucket of query ``t``.

- ``naive``:     the dense ``T × T`` matrices: O(T²) time and memory.
- ``recurrent``: token by token with a :class:`~loglin_edu.state.FenwickState`: O(log T) states.
- ``chunkwise``: the chunk scan of :mod:`loglin_edu.chunk_scan`: O(T log T), no ``T × T`` tensor.
- ``triton``:    the Triton kernels of :mod:`loglin_edu.kernels` (log-linear Mamba-2: decay only, no
  delta rule): a Fenwick tree of chunk states, O(T log T). The default on CUDA tensors; on a CPU it
  runs under Triton's interpreter. In ``FORMS`` where triton is installed; not in
  ``loglinear_attention.forms`` (``REFERENCE_FORMS``: the forms every variant has, which
  ``compare_forms`` runs by default).

``level_scales ≡ 1`` recovers the linear model exactly.

``return_state=True`` also returns the decoding state after the sequence (a
:class:`~loglin_edu.state.FenwickState`), so decoding continues where a prefill stopped: the recurrent
form returns the state it stepped, the chunkwise form the chunk scan's, the naive form builds it from
its definition (:func:`~loglin_edu.state.prefix_state`), and the triton form does so in PyTorch, in
float32 (decay only: ``O(T·K·V)``, one product per level).
"""

from __future__ import annotations

from importlib.util import find_spec

import torch

from ._checks import check_chunk_size, check_form, check_gate, check_level_scales, check_qkv
from ._layout import heads_first, time_first
from .chunk_scan import chunk_scan
from .deltanet import delta_attention_matrix
from .linear import decay_attention_matrix
from .masks import hierarchical_mask
from .state import FenwickState, prefix_state

REFERENCE_FORMS = ("naive", "recurrent", "chunkwise")
KERNEL_FORMS = ("triton",) if find_spec("triton") is not None else ()
FORMS = REFERENCE_FORMS + KERNEL_FORMS


def recurrent_loglinear(q, k, v, level_scales, log_decay=None, beta=None, state=None) -> torch.Tensor:
    """Token-by-token log-linear attention through a :class:`FenwickState`, heads-first.

    q, k: ``[B, H, T, K]``; v: ``[B, H, T, V]``; level_scales: ``[B, H, T, L]``; log_decay, beta:
    ``[B, H, T]`` or None; state: the :class:`FenwickState` to continue from (advanced in place; a fresh
    one when None). Returns ``[B, H, T, V]``.
    """
    state = FenwickState() if state is None else state
    outputs = []
    for t in range(q.shape[2]):
        outputs.append(
            state.step(
                q[:, :, t], k[:, :, t], v[:, :, t], level_scales[:, :, t],
                None if log_decay is None else log_decay[:, :, t],
                None if beta is None else beta[:, :, t],
            )
        )
    return torch.stack(outputs, dim=2)


def naive_loglinear(q, k, v, level_scales, log_decay=None, beta=None) -> torch.Tensor:
    """``(A ⊙ M^S ⊙ M^H) V`` with dense masks, heads-first (shapes as :func:`recurrent_loglinear`)."""
    if beta is None:
        matrix = decay_attention_matrix(q, k, log_decay)
    else:
        matrix = delta_attention_matrix(q, k, log_decay, beta)
    return (matrix * hierarchical_mask(level_scales.transpose(1, 2))) @ v


def loglinear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    level_scales: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    *,
    form: str | None = None,
    chunk_size: int = 64,
    return_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, FenwickState]:
    """Log-linear attention over any linear model of the book.

    q, k: ``[B, T, H, K]`` (or ``H = 1``: shared by all heads); v: ``[B, T, H, V]``;
    level_scales: ``[B, T, H, L]`` with ``L >= num_levels(T)`` (λ, indexed by query and level);
    log_decay: ``[B, T, H]`` with ``g <= 0`` or None (no decay); beta: ``[B, T, H]`` or None (no delta
    rule). Log-linear Mamba-2 passes ``log_decay``; log-linear Gated DeltaNet passes both.
    form: ``"naive"``, ``"recurrent"``, ``"chunkwise"`` or ``"triton"`` (decay only, no ``beta``); None
    (the default) means ``"triton"`` for CUDA tensors of fp32/fp16/bf16 without ``beta``, ``"chunkwise"``
    otherwise. chunk_size: a power of two (chunkwise and triton; triton raises it to at least 16).
    Returns ``[B, T, H, V]``; with ``return_state=True`` the pair ``(out, state)``, ``state`` the
    :class:`FenwickState` after the ``T`` tokens (levels ``[B, H, K, V]``, ``position = T``; float32 for
    the triton form), which :meth:`FenwickState.step` continues from. No scale or normalisation is applied
    to q, k.
    """
    dims = check_qkv(q, k, v)
    check_level_scales(level_scales, dims, q)
    if log_decay is not None:
        check_gate("log_decay", log_decay, dims, q, nonpositive=True)
    if beta is not None:
        check_gate("beta", beta, dims, q)
    if form is None:
        fast = q.is_cuda and beta is None and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
        form = "triton" if fast and KERNEL_FORMS else "chunkwise"
    check_form(form, FORMS)
    check_chunk_size(chunk_size)
    if not isinstance(return_state, bool):
        raise TypeError(f"return_state must be a bool, got {type(return_state).__name__}")
    if form == "triton":
        if beta is not None:
            raise ValueError(
                "form='triton' computes log-linear Mamba-2 (log_decay only); for the delta rule (beta) use "
                f"one of {REFERENCE_FORMS}"
            )
        from .kernels.loglinear_mamba2 import loglinear_mamba2

        out = loglinear_mamba2(q, k, v, level_scales, log_decay, chunk_size=chunk_size)
        if not return_state:
            return out
        wide = [None if x is None else x.float() for x in (k, v, log_decay)]
        g = None if log_decay is None else wide[2].transpose(1, 2)
        return out, prefix_state(heads_first(wide[0], dims.H), heads_first(wide[1], dims.H), g)
    H = dims.H
    args = (
        heads_first(q, H), heads_first(k, H), heads_first(v, H), level_scales.transpose(1, 2),
        None if log_decay is None else log_decay.transpose(1, 2),
        None if beta is None else beta.transpose(1, 2),
    )
    state = None
    if form == "naive":
        out = naive_loglinear(*args)
        state = prefix_state(*args[1:3], *args[4:]) if return_state else None
    elif form == "recurrent":
        state = FenwickState()
        out = recurrent_loglinear(*args, state=state)
    else:
        out = chunk_scan(*args, chunk_size=chunk_size, return_state=return_state)
        out, state = out if return_state else (out, None)
    return (time_first(out), state) if return_state else time_first(out)
