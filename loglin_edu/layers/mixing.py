"""The sequence-mixing call every layer makes: the package's operators, picked by ``backend`` and ``form``.

A layer has already checked its inputs (it built them), so this calls the heads-first forms the public
operators dispatch to — :func:`~loglin_edu.linear.chunkwise_linear`, :func:`~loglin_edu.chunk_scan.chunk_scan`
and their naive and recurrent siblings — without the public operators' input checks. Those checks read
values (``log_decay <= 0``, finiteness), which would stop a GPU pipeline to wait for the answer and cannot
run inside :func:`torch.func.vmap` (the training ensemble).

Backends:

- ``"torch"``: the PyTorch forms (``form`` = ``"naive"``, ``"recurrent"`` or ``"chunkwise"``); any device.
- ``"triton"``: :func:`loglin_edu.kernels.loglinear_mamba2` (the Triton kernel of log-linear Mamba-2, behind
  ``loglinear_attention(..., form="triton")``), when the package has it; on CUDA, or on a CPU under Triton's
  interpreter; inside :func:`torch.func.vmap` too (its autograd Function folds the mapped dimension into
  the batch).
- ``"auto"``: ``"triton"`` for a layer that has a kernel, on a CUDA tensor; else ``"torch"``.
"""

from __future__ import annotations

import torch

from .. import _checks, loglinear
from .._layout import heads_first, time_first
from ..chunk_scan import chunk_scan
from ..deltanet import delta_attention_matrix
from ..linear import _linear_forms, decay_attention_matrix

BACKENDS = ("auto", "torch", "triton")
FORMS = ("naive", "recurrent", "chunkwise")


def triton_form_available() -> bool:
    """True when :func:`~loglin_edu.loglinear_attention` offers ``form="triton"``."""
    return "triton" in loglinear.FORMS


def resolve_backend(backend: str, x: torch.Tensor, has_kernel: bool) -> str:
    """The backend a call on ``x`` uses: ``"torch"`` or ``"triton"`` (module docstring).

    has_kernel: whether a Triton kernel computes this layer's operator (only log-linear Mamba-2 today).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch"
    usable = has_kernel and triton_form_available()
    if backend == "auto":
        return "triton" if usable and x.is_cuda else "torch"
    if not usable:
        why = "this layer has no Triton kernel" if not has_kernel else "loglinear_attention has no form='triton' yet"
        raise ValueError(f"backend='triton' is not available: {why}; use backend='torch' or 'auto'")
    return "triton"


def check_form(form: str) -> None:
    """``form`` must name one of the PyTorch forms."""
    _checks.check_form(form, FORMS)


def mix(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    level_scales: torch.Tensor | None = None,
    *,
    backend: str = "torch",
    form: str = "chunkwise",
    chunk_size: int = 64,
) -> torch.Tensor:
    """``O = (A ⊙ M) V`` of a linear model (``level_scales=None``) or of its log-linear version.

    q, k: ``[B, T, Hk, K]`` with ``Hk`` = H or 1 (shared by heads); v: ``[B, T, H, V]``; log_decay, beta:
    ``[B, T, H]`` or None; level_scales: ``[B, T, H, L]`` (λ) or None. backend: an already resolved
    ``"torch"`` or ``"triton"``. Returns ``[B, T, H, V]``.
    """
    if torch.is_autocast_enabled(q.device.type):  # the operators run in float32 under mixed precision
        with torch.autocast(q.device.type, enabled=False):
            up = [None if x is None else x.float() for x in (q, k, v, log_decay, beta, level_scales)]
            return mix(*up, backend=backend, form=form, chunk_size=chunk_size)
    if backend == "triton":
        if beta is not None or level_scales is None:
            raise ValueError("backend='triton' computes log-linear Mamba-2: level_scales and no beta")
        from ..kernels.loglinear_mamba2 import loglinear_mamba2

        return loglinear_mamba2(q, k, v, level_scales, log_decay, chunk_size=chunk_size)
    H = v.shape[2]
    q, k, v = heads_first(q, H), heads_first(k, H), heads_first(v, H)
    g = None if log_decay is None else log_decay.transpose(1, 2)
    b = None if beta is None else beta.transpose(1, 2)
    if level_scales is None:
        def matrix(q_, k_, g_, b_):
            return decay_attention_matrix(q_, k_, g_) if b_ is None else delta_attention_matrix(q_, k_, g_, b_)

        return time_first(_linear_forms(q, k, v, g, b, form, chunk_size, matrix))
    lam = level_scales.transpose(1, 2)
    if form == "naive":
        out = loglinear.naive_loglinear(q, k, v, lam, g, b)
    elif form == "recurrent":
        out = loglinear.recurrent_loglinear(q, k, v, lam, g, b)
    else:
        out = chunk_scan(q, k, v, lam, g, b, chunk_size=chunk_size)
    return time_first(out)
