"""The public operators and their forms, in one registry.

Every operator computes ``O = (A ⊙ M) V`` of one model of the book (PAPER.md §1) and offers the same
*forms* — algorithms that compute the same function:

| operator | model |
|---|---|
| :func:`softmax_attention` | causal softmax attention |
| :func:`linear_attention`, :func:`mamba2_attention` | linear attention, Mamba-2 (scalar decay) |
| :func:`gated_deltanet_attention` | Gated DeltaNet (delta rule with decay) |
| :func:`loglinear_attention` | the log-linear version of any of the three linear models |

Forms (:data:`REFERENCE_FORMS`): ``"naive"`` (dense ``T × T``), ``"recurrent"`` (token by token) and
``"chunkwise"`` (chunks: O(T·C) or, log-linear, O(T log T)), all in PyTorch, plus ``"triton"``: the
Triton kernels of :mod:`loglin_edu.kernels`: whole-operator kernels for log-linear attention (log-linear Mamba-2
without ``beta``, log-linear Gated DeltaNet with it) and for Mamba-2 (and linear attention, its decay-free case);
for Gated DeltaNet the chunkwise form with each chunk's WY factors by a Triton operator (:func:`delta_rule_triton`).
Log-linear Gated DeltaNet's kernels are an ``autograd.Function``, which ``torch.compile`` cannot keep in one graph:
inside a compiled function its Triton form is the chunk scan on that operator instead
(:func:`loglinear_delta_rule_triton`), the same function.
Triton is imported only when a call needs it, never at import (where it is only looked up).

With ``return_state=True`` (:func:`loglinear_attention`, :func:`mix`) a call also returns the decoding
state after its ``T`` tokens — a prefill: the :class:`~loglin_edu.state.FenwickState` of a log-linear
model, the ``[B, H, K, V]`` state of a linear one. Every form returns the same state; the Triton kernels'
forms build it in PyTorch from its definition (:func:`~loglin_edu.state.prefix_state`, float32, ``O(T·K·V)``),
Gated DeltaNet's carries it across its chunks as the chunkwise form does.

The public operators take ``[B, T, H, D]`` tensors and check them (errors name the argument). Layers call
:func:`mix` instead: the same dispatch without the checks, which read values (``log_decay <= 0``,
finiteness) and would make a GPU wait, and cannot run inside :func:`torch.func.vmap`.
"""

from __future__ import annotations

import math
from importlib.util import find_spec
from typing import Callable

import torch

from .checks import check_chunk_size, check_form, check_gate, check_level_scales, check_qkv
from .chunk_scan import chunk_scan
from .deltanet import delta_attention_matrix
from .layout import heads_first, time_first
from .linear import chunkwise_linear, decay_attention_matrix, recurrent_linear
from .loglinear import naive_loglinear, recurrent_loglinear
from .softmax import chunkwise_softmax, naive_softmax, recurrent_softmax
from .state import FenwickState, linear_prefix_state, prefix_state

REFERENCE_FORMS = ("naive", "recurrent", "chunkwise")
KERNEL_FORM = "triton"
BACKENDS = ("auto", "torch", "triton")

Form = Callable[..., torch.Tensor]


def naive_linear(q, k, v, log_decay=None, beta=None, return_state=False):
    """``((Q Kᵀ) ⊙ M^S) V`` (decay) or ``(A_delta ⊙ M^S) V`` (delta rule), heads-first. q, k: ``[B, H, T, K]``;
    v: ``[B, H, T, V]``; log_decay, beta: ``[B, H, T]`` or None. Returns ``[B, H, T, V]``, and with
    ``return_state`` the state after the sequence from its definition (``[B, H, K, V]``)."""
    matrix = decay_attention_matrix(q, k, log_decay) if beta is None else delta_attention_matrix(q, k, log_decay, beta)
    out = matrix @ v
    return (out, linear_prefix_state(k, v, log_decay, beta)) if return_state else out


LINEAR_FORMS: dict[str, Form] = {  # (q, k, v, log_decay, beta, chunk_size, return_state), heads-first
    "naive": lambda q, k, v, g, b, chunk_size, return_state: naive_linear(q, k, v, g, b, return_state),
    "recurrent": lambda q, k, v, g, b, chunk_size, return_state: recurrent_linear(q, k, v, g, b, return_state),
    "chunkwise": chunkwise_linear,
}
LOGLINEAR_FORMS: dict[str, Form] = {  # (q, k, v, level_scales, log_decay, beta, chunk_size, return_state)
    "naive": lambda q, k, v, lam, g, b, chunk_size, return_state: naive_loglinear(q, k, v, lam, g, b, return_state),
    "recurrent": lambda q, k, v, lam, g, b, chunk_size, return_state: recurrent_loglinear(
        q, k, v, lam, g, b, return_state
    ),
    "chunkwise": chunk_scan,
}
SOFTMAX_FORMS: dict[str, Form] = {  # (q, k, v, scale, chunk_size), heads-first
    "naive": lambda q, k, v, scale, chunk_size: naive_softmax(q, k, v, scale),
    "recurrent": lambda q, k, v, scale, chunk_size: recurrent_softmax(q, k, v, scale),
    "chunkwise": chunkwise_softmax,
}


TRITON_FOUND = find_spec("triton") is not None
"""Whether triton can be imported here: looked up (not imported) once, when this module is, so that no compiled
graph breaks at the import machinery (``torch.compile`` does not trace ``find_spec``)."""


def kernels_available() -> bool:
    """Whether triton can be imported here, i.e. whether ``form="triton"`` exists (:data:`TRITON_FOUND`)."""
    return TRITON_FOUND


def forms() -> tuple[str, ...]:
    """The forms every operator offers in this installation: :data:`REFERENCE_FORMS`, and ``"triton"`` where triton
    can be imported (every variant has one)."""
    return REFERENCE_FORMS + ((KERNEL_FORM,) if kernels_available() else ())


def kernel_by_default(loglinear: bool, beta: bool) -> bool:
    """Whether CUDA calls take the Triton form when none is asked for: log-linear Mamba-2 (no delta rule).

    The delta rule's Triton forms are taken on request only (``form="triton"``, ``backend="triton"``). Log-linear
    Gated DeltaNet's whole-operator kernels (steps 6-9, its eager calls): on an H200 their forward and backward take
    about five times as long as the decay-only kernels at identical shapes, for about five times the counted work
    (chapter 9), and no measurement here says at which shapes they beat the chunkwise form. The WY-factor operator
    of step 10 inside the PyTorch chunk forms (Gated DeltaNet; log-linear Gated DeltaNet inside ``torch.compile``, with
    step 11's level operator): measured faster than the PyTorch forms only in the compiled training step of
    chapter 11. So is Mamba-2's kernel
    (step 1, one walk over the chunks per head): fast where a batch has many short sequences, as in training on
    recall tasks, latency-bound at long ``T`` with few heads.
    """
    return loglinear and not beta


def layer_backend(requested: str, kernel: bool) -> str:
    """The backend a layer gets when ``requested`` is asked of every layer of a model or an experiment.

    ``"triton"`` means the Triton kernels wherever a layer has them (``kernel``: the recurrent mixers do, softmax
    attention does not): Mamba-2, Gated DeltaNet and their log-linear versions, of which ``"auto"`` takes only
    log-linear Mamba-2's; the other layers get ``"auto"``. ``"auto"`` and ``"torch"`` pass through.
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    return "auto" if requested == KERNEL_FORM and not kernel else requested


def default_form(x: torch.Tensor, loglinear: bool, beta: bool) -> str:
    """``"triton"`` for CUDA tensors of fp32/fp16/bf16 when :func:`kernel_by_default`, else ``"chunkwise"``."""
    fast = x.is_cuda and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
    usable = kernel_by_default(loglinear, beta) and KERNEL_FORM in forms()
    return KERNEL_FORM if fast and usable else "chunkwise"


def resolve_backend(backend: str, x: torch.Tensor, loglinear: bool, beta: bool) -> str:
    """The backend a layer's call on ``x`` uses, ``"torch"`` or ``"triton"``.

    ``"auto"`` takes the Triton kernel when it is the default for the variant (:func:`kernel_by_default`),
    triton is installed and ``x`` is on CUDA; ``"triton"`` insists on it (a ``ValueError`` says why it
    cannot); ``"torch"`` runs the PyTorch forms.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch"
    usable = KERNEL_FORM in forms()
    if backend == "auto":
        return "triton" if usable and x.is_cuda and kernel_by_default(loglinear, beta) else "torch"
    if not usable:
        raise ValueError("backend='triton' is not available: triton is not installed; use backend='torch' or 'auto'")
    return "triton"


def mix(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    level_scales: torch.Tensor | None = None,
    *,
    form: str = "chunkwise",
    chunk_size: int = 64,
    return_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | FenwickState]:
    """``O = (A ⊙ M) V`` of a linear model (``level_scales=None``) or of its log-linear version, unchecked.

    q, k: ``[B, T, Hk, K]`` with ``Hk`` = H or 1 (shared by heads); v: ``[B, T, H, V]``; log_decay, beta:
    ``[B, T, H]`` or None; level_scales: ``[B, T, H, L]`` (λ) or None. form: one of :func:`forms`.
    Returns ``[B, T, H, V]``; with ``return_state`` the pair ``(out, state)`` (module docstring). Under
    autocast the operators run in float32.
    """
    if torch.is_autocast_enabled(q.device.type):
        with torch.autocast(q.device.type, enabled=False):
            up = [None if x is None else x.float() for x in (q, k, v, log_decay, beta, level_scales)]
            return mix(*up, form=form, chunk_size=chunk_size, return_state=return_state)
    whole_kernels = beta is None or (level_scales is not None and not torch.compiler.is_compiling())
    if form == KERNEL_FORM and whole_kernels:
        if level_scales is None:
            from .kernels.step1_mamba2_chunked import mamba2_triton

            out = mamba2_triton(q, k, v, log_decay, chunk_size=chunk_size)
            return (out, kernel_prefill_state(k, v, log_decay, beta, loglinear=False)) if return_state else out
        if beta is None:
            from .kernels.step5_loglinear_mamba2 import loglinear_mamba2

            out = loglinear_mamba2(q, k, v, level_scales, log_decay, chunk_size=chunk_size)
        else:
            from .kernels.step9_loglinear_gated_deltanet import loglinear_gated_deltanet

            out = loglinear_gated_deltanet(q, k, v, level_scales, log_decay, beta, chunk_size=chunk_size)
        return (out, kernel_prefill_state(k, v, log_decay, beta)) if return_state else out
    H = v.shape[2]
    q, k, v = heads_first(q, H), heads_first(k, H), heads_first(v, H)
    g = None if log_decay is None else log_decay.transpose(1, 2)
    b = None if beta is None else beta.transpose(1, 2)
    if level_scales is None:
        linear = delta_rule_triton if form == KERNEL_FORM else LINEAR_FORMS[form]
        result = linear(q, k, v, g, b, chunk_size, return_state)
    else:
        loglinear = loglinear_delta_rule_triton if form == KERNEL_FORM else LOGLINEAR_FORMS[form]
        result = loglinear(q, k, v, level_scales.transpose(1, 2), g, b, chunk_size, return_state)
    return (time_first(result[0]), result[1]) if return_state else time_first(result)


def delta_rule_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None,
                      beta: torch.Tensor, chunk_size: int, return_state: bool):
    """Gated DeltaNet's Triton form, heads-first (shapes as :func:`~loglin_edu.linear.chunkwise_linear`): the
    chunkwise form with every chunk's WY factors computed, forward and backward, by one Triton operator
    (:mod:`loglin_edu.kernels.step10_delta_factors_op`), the states carried across chunks by PyTorch. chunk_size
    is raised to 16 (the smallest ``tl.dot`` tile) if smaller; the result does not depend on it."""
    from .kernels.step10_delta_factors_op import wy_factors_triton

    return chunkwise_linear(q, k, v, log_decay, beta, max(chunk_size, 16), return_state, wy_factors_triton)


def loglinear_delta_rule_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, level_scales: torch.Tensor,
                                log_decay: torch.Tensor | None, beta: torch.Tensor, chunk_size: int,
                                return_state: bool):
    """Log-linear Gated DeltaNet's Triton form inside ``torch.compile``, heads-first (shapes as
    :func:`~loglin_edu.chunk_scan.chunk_scan`): the chunk scan with every chunk's WY factors by the operator of
    :func:`delta_rule_triton` and its intra-chunk product ``(P ⊙ Λ) V`` by a second one
    (:mod:`loglin_edu.kernels.step11_level_intra_op`), the levels and the states carried across chunks by PyTorch,
    all of it one compiled graph. Called eagerly it would pay a set of launches per chunk and, at long ``T``, take
    many times as long as the whole-operator kernels (:mod:`loglin_edu.kernels.step9_loglinear_gated_deltanet`),
    which eager calls take instead (:func:`mix`). Compiled, it suits many short sequences, as in training on recall
    tasks (chapter 11): its graph unrolls the loop over chunks, so compiling takes longer and the graph grows with
    ``T / C``, and at long ``T`` the whole-operator kernels called eagerly remain several times faster than it.

    Its products follow ``torch.backends.cuda.matmul.allow_tf32``, the operators' and the solve's included, where the
    whole-operator kernels keep those of fp32 inputs in tf32x3: with TF32 set, a compiled step and an eager one
    differ by TF32's rounding. The WY-factor operator returns no ``T_β``, so the decoding state is built from its
    definition (:func:`~loglin_edu.state.prefix_state`, float32). chunk_size is raised to 16 if smaller.
    """
    from .kernels.step10_delta_factors_op import wy_factors_triton
    from .kernels.step11_level_intra_op import level_intra_triton

    out = chunk_scan(q, k, v, level_scales, log_decay, beta, max(chunk_size, 16), factors=wy_factors_triton,
                     intra_product=level_intra_triton)
    if not return_state:
        return out
    return out, prefix_state(k.float(), v.float(), None if log_decay is None else log_decay.float(), beta.float())


def kernel_prefill_state(k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None,
                         beta: torch.Tensor | None = None, loglinear: bool = True) -> FenwickState | torch.Tensor:
    """The decoding state after a Triton-form call, from its definition in float32: k ``[B, T, Hk, K]``,
    v ``[B, T, H, V]``, log_decay, beta ``[B, T, H]`` or None. Log-linear: the
    :class:`~loglin_edu.state.FenwickState` (one product per level); linear (``loglinear=False``): the
    ``[B, H, K, V]`` state."""
    H = v.shape[2]
    g = None if log_decay is None else log_decay.float().transpose(1, 2)
    b = None if beta is None else beta.float().transpose(1, 2)
    state = prefix_state if loglinear else linear_prefix_state
    return state(heads_first(k.float(), H), heads_first(v.float(), H), g, b)


def _checked(q, k, v, level_scales, log_decay, beta, form, chunk_size):
    """Check the inputs of an operator; returns the form to run."""
    dims = check_qkv(q, k, v)
    if level_scales is not None:
        check_level_scales(level_scales, dims, q)
    if log_decay is not None:
        check_gate("log_decay", log_decay, dims, q, nonpositive=True)
    if beta is not None:
        check_gate("beta", beta, dims, q)
    loglinear, delta = level_scales is not None, beta is not None
    if form is None:
        form = default_form(q, loglinear, delta)
    if form == KERNEL_FORM and KERNEL_FORM not in forms():
        raise ValueError(f"form='triton' is not available here (triton is not installed); use one of {REFERENCE_FORMS}")
    check_form(form, forms())
    check_chunk_size(chunk_size)
    return form


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    form: str = "chunkwise",
    chunk_size: int = 64,
) -> torch.Tensor:
    """Causal softmax attention ``o_t = Σ_{s<=t} softmax_s(scale · q_t·k_s) v_s`` (:mod:`loglin_edu.softmax`).

    q, k: ``[B, T, H, K]`` (or ``H = 1``); v: ``[B, T, H, V]``; scale: ``1/√K`` when None; form: one of
    :data:`REFERENCE_FORMS`. Returns ``[B, T, H, V]``.
    """
    dims = check_qkv(q, k, v)
    check_form(form, REFERENCE_FORMS)
    check_chunk_size(chunk_size)
    scale = 1.0 / math.sqrt(dims.K) if scale is None else float(scale)
    q, k, v = (heads_first(x, dims.H) for x in (q, k, v))
    return time_first(SOFTMAX_FORMS[form](q, k, v, scale, chunk_size))


def linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, form: str = "chunkwise", chunk_size: int = 64
) -> torch.Tensor:
    """Causal linear attention ``o_t = Σ_{s<=t} (q_t·k_s) v_s`` (:mod:`loglin_edu.linear`).

    q, k: ``[B, T, H, K]`` (or ``H = 1``: shared by all heads); v: ``[B, T, H, V]`` -> ``[B, T, H, V]``.
    """
    return mamba2_attention(q, k, v, None, form=form, chunk_size=chunk_size)


def mamba2_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None,
    *,
    form: str = "chunkwise",
    chunk_size: int = 64,
) -> torch.Tensor:
    """Mamba-2 (scalar decay): ``o_t = Σ_{s<=t} (q_t·k_s) exp(G_t - G_s) v_s`` (:mod:`loglin_edu.linear`).

    q, k: ``[B, T, H, K]`` (or ``H = 1``); v: ``[B, T, H, V]``; log_decay: ``[B, T, H]`` (``g <= 0``) or
    None (linear attention). form: one of :func:`forms` (``"triton"``: step 1's kernel). Returns ``[B, T, H, V]``.
    """
    form = _checked(q, k, v, None, log_decay, None, form, chunk_size)
    return mix(q, k, v, log_decay, form=form, chunk_size=chunk_size)


def gated_deltanet_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    form: str = "chunkwise",
    chunk_size: int = 64,
) -> torch.Tensor:
    """Gated DeltaNet (:mod:`loglin_edu.deltanet`). q, k: ``[B, T, H, K]`` (or ``H = 1``); v: ``[B, T, H, V]``;
    log_decay: ``[B, T, H]`` (``g <= 0``) or None (DeltaNet); beta: ``[B, T, H]``. Returns ``[B, T, H, V]``.
    """
    if beta is None:
        raise ValueError("beta must be a [B, T, H] tensor for the delta rule, got None (use mamba2_attention)")
    form = _checked(q, k, v, None, log_decay, beta, form, chunk_size)
    return mix(q, k, v, log_decay, beta, form=form, chunk_size=chunk_size)


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
    """Log-linear attention over any linear model of the book (:mod:`loglin_edu.loglinear`).

    q, k: ``[B, T, H, K]`` (or ``H = 1``: shared by all heads); v: ``[B, T, H, V]``;
    level_scales: ``[B, T, H, L]`` with ``L >= num_levels(T)`` (λ, indexed by query and level);
    log_decay: ``[B, T, H]`` with ``g <= 0`` or None (no decay); beta: ``[B, T, H]`` or None (no delta
    rule). Log-linear Mamba-2 passes ``log_decay``; log-linear Gated DeltaNet passes both.
    form: one of :func:`forms`; None (the default) means ``"triton"`` for CUDA tensors of fp32/fp16/bf16
    when the kernels compute the variant, ``"chunkwise"`` otherwise. chunk_size: a power of two
    (chunkwise and triton; triton raises it to at least 16). Returns ``[B, T, H, V]``; with
    ``return_state=True`` the pair ``(out, state)``, ``state`` the :class:`~loglin_edu.state.FenwickState`
    after the ``T`` tokens (levels ``[B, H, K, V]``, ``position = T``; float32 for the triton form), which
    :meth:`~loglin_edu.state.FenwickState.step` or :class:`~loglin_edu.decoding.FenwickCache` continue
    from. No scale or normalisation is applied to q, k.
    """
    form = _checked(q, k, v, level_scales, log_decay, beta, form, chunk_size)
    if not isinstance(return_state, bool):
        raise TypeError(f"return_state must be a bool, got {type(return_state).__name__}")
    return mix(q, k, v, log_decay, beta, level_scales, form=form, chunk_size=chunk_size, return_state=return_state)
