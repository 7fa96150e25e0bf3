"""The chunk representation of a linear model: what each chunk of ``C`` tokens needs to know.

Cut the sequence into ``N`` aligned chunks of ``C`` tokens. Whatever the model (linear attention,
Mamba-2's scalar decay, Gated DeltaNet's delta rule), the output of a token ``t`` in chunk ``c`` splits
into a part from keys of the same chunk and a part read from the state ``S_c`` at the chunk's start:

    o_t     = Σ_{s in chunk, s <= t} intra[t, s] v_s  +  S_cᵀ query_t
    S_{c+1} = Φ_c S_c + own_c

``intra`` is the ``C × C`` block of ``A ⊙ M^S``; ``query_t`` is ``q_t`` carried back through the chunk's
transitions; ``own_c`` is what the chunk's tokens write into the state at its end; ``Φ_c`` is the chunk's
transition (a scalar ``exp(G_end - G_start)`` with decay only, a ``K × K`` matrix with the delta rule).

With the delta rule, the chunk is solved in closed form by the WY/UT representation: with
``γ_i = exp(G_i - G_start)``, ``Γ[i, j] = γ_i / γ_j`` (``j <= i``) and the unit lower-triangular

    A_β = I + strict_lower(diag(β) (Γ ⊙ K Kᵀ)),    T_β = A_β⁻¹,
    U₀ = T_β diag(β) V,    W = T_β diag(β γ) K        (pseudo-values U = U₀ - W S_c),

    intra = (Γ ⊙ Q Kᵀ) T_β diag(β),   query = diag(γ) Q - (Γ ⊙ Q Kᵀ) W,
    own   = K̃ᵀ U₀,                    Φ     = γ_C I - K̃ᵀ W,              K̃ = diag(γ_C / γ) K.

``own`` is linear in the values: ``own = Eᵀ V`` with the *write keys* ``E = diag(β) T_βᵀ K̃`` (``E = K̃``
without the delta rule), so the tokens of any subset of a chunk write ``Eᵀ diag(mask) V`` — what the
decoding state needs to split the last chunk into its Fenwick levels.

All tensors here are heads-first: ``[B, H, N, C, D]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import pad_time


@dataclass
class ChunkTerms:
    """Per-chunk pieces of a linear model (module docstring), ``N`` chunks of ``C`` tokens.

    intra: ``[B, H, N, C, C]``; query: ``[B, H, N, C, K]``; own: ``[B, H, N, K, V]``; write_keys:
    ``[B, H, N, C, K]`` (``own = write_keysᵀ V``; None when the WY factors came without ``T_β``); decay:
    ``[B, H, N]`` (scalar transition) or ``None``;
    transition: ``[B, H, N, K, K]`` or ``None``.
    """

    intra: torch.Tensor
    query: torch.Tensor
    own: torch.Tensor
    write_keys: torch.Tensor | None
    decay: torch.Tensor | None = None
    transition: torch.Tensor | None = None

    def propagate(self, chunk: int, state: torch.Tensor) -> torch.Tensor:
        """``Φ_c S``: carry ``state: [B, H, K, V]`` from the start to the end of chunk ``chunk``."""
        if self.transition is not None:
            return self.transition[:, :, chunk] @ state
        if self.decay is not None:
            return self.decay[:, :, chunk, None, None] * state
        return state


def split_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[B, H, T, ...] -> [B, H, N, C, ...]``, zero-padding T up to ``N = ceil(T / C)`` chunks."""
    n_chunks = -(-x.shape[2] // chunk_size)
    x = pad_time(x, n_chunks * chunk_size)
    return x.reshape(x.shape[0], x.shape[1], n_chunks, chunk_size, *x.shape[3:])


def within_chunk_decay(g_cum: torch.Tensor) -> torch.Tensor:
    """``Γ[i, j] = exp(G_i - G_j)`` for ``j <= i``, 0 above: ``[..., C] -> [..., C, C]``.

    g_cum: the log decay summed from the chunk's start (``G_i - G_start``). One subtraction per entry: the sums
    are local to a chunk, so they stay small and their difference keeps float32's precision; over a whole
    sequence :func:`~loglin_edu.masks.segment_sum` avoids subtracting large sums instead.
    """
    C = g_cum.shape[-1]
    causal = torch.ones(C, C, dtype=torch.bool, device=g_cum.device).tril()
    return (g_cum[..., :, None] - g_cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()


def wy_factors(
    qc: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, beta: torch.Tensor, g_cum: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The WY factors of every chunk (module docstring): ``(intra, query, W, U₀, T_β)``.

    qc, kc: ``[B, H, N, C, K]``; vc: ``[B, H, N, C, V]``; beta, g_cum: ``[B, H, N, C]`` (``g_cum = G_i - G_start``).
    Returns intra, T_β: ``[B, H, N, C, C]``; query, W: ``[B, H, N, C, K]``; U₀: ``[B, H, N, C, V]``.
    :func:`chunk_terms` takes any function with this signature (the Triton operator of
    :mod:`loglin_edu.kernels.step10_delta_factors_op` is one, and returns no ``T_β``).
    """
    within = within_chunk_decay(g_cum)  # Γ[i, j] = γ_i / γ_j for j <= i, 0 above
    scores = (qc @ kc.transpose(-1, -2)) * within  # Γ ⊙ Q Kᵀ
    a_beta = ((beta[..., None] * kc) @ kc.transpose(-1, -2)) * within  # diagonal ignored below
    eye = torch.eye(qc.shape[-2], dtype=qc.dtype, device=qc.device)
    t_beta = torch.linalg.solve_triangular(a_beta, eye.expand_as(a_beta), upper=False, unitriangular=True)
    w = t_beta @ ((beta * g_cum.exp())[..., None] * kc)
    return ((scores @ t_beta) * beta[..., None, :], qc * g_cum.exp()[..., None] - scores @ w, w,
            t_beta @ (beta[..., None] * vc), t_beta)


def chunk_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None,
    beta: torch.Tensor | None,
    chunk_size: int,
    factors=wy_factors,
) -> ChunkTerms:
    """Chunk representation of a linear model. q, k: ``[B, H, T, K]``; v: ``[B, H, T, V]``;
    log_decay, beta: ``[B, H, T]`` or ``None``. Padded tokens (past T) have k = v = g = β = 0: they
    neither write nor decay, so the first T outputs are unchanged. factors: how the delta rule's WY factors
    are computed (:func:`wy_factors`); one that returns no ``T_β`` leaves ``write_keys`` None.
    """
    qc, kc, vc = (split_chunks(x, chunk_size) for x in (q, k, v))
    g = torch.zeros(qc.shape[:4], dtype=q.dtype, device=q.device) if log_decay is None else split_chunks(
        log_decay, chunk_size
    )
    g_cum = g.cumsum(-1)  # G_i - G_start, [B, H, N, C]
    k_to_end = kc * (g_cum[..., -1:] - g_cum).exp()[..., None]  # K̃
    decay_to_end = g_cum[..., -1].exp()  # γ_C, [B, H, N]
    if beta is None:
        return ChunkTerms(
            intra=(qc @ kc.transpose(-1, -2)) * within_chunk_decay(g_cum),
            query=qc * g_cum.exp()[..., None],
            own=k_to_end.transpose(-1, -2) @ vc,
            write_keys=k_to_end,
            decay=None if log_decay is None else decay_to_end,
        )
    b = split_chunks(beta, chunk_size)
    intra, query, w, u0, t_beta = factors(qc, kc, vc, b, g_cum)
    key_eye = torch.eye(kc.shape[-1], dtype=q.dtype, device=q.device)
    return ChunkTerms(
        intra=intra,
        query=query,
        own=k_to_end.transpose(-1, -2) @ u0,  # = Eᵀ V
        write_keys=None if t_beta is None else b[..., None] * (t_beta.transpose(-1, -2) @ k_to_end),  # E
        transition=decay_to_end[..., None, None] * key_eye - k_to_end.transpose(-1, -2) @ w,
    )
