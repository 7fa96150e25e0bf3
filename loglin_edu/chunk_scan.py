"""The chunk-scan algorithm for log-linear attention: O(T log T) time, no ``T × T`` tensor.

Cut the sequence into aligned chunks of ``C = 2^c`` tokens. Two keys of one chunk are at level
``<= c``; a key in chunk ``sc`` and a query in chunk ``tc > sc`` are at level ``c + bit_length(tc ^ sc)``.

1. **Intra-chunk** (levels ``0..c``): per chunk the dense ``C × C`` product
   ``((A ⊙ M^S)_chunk ⊙ Λ) V`` with ``Λ[i, j] = λ[i, level(i, j)]``, the same level pattern in every chunk.
2. **Inter-chunk** (chunk levels ``1..n``, ``n = bit_length(N - 1)``): a binary counter over chunks holds
   one ``K × V`` state per chunk level. Entering chunk ``tc``, chunk levels ``0..j`` (``j`` = trailing
   zeros of ``tc``; level 0 is the previous chunk itself) merge into level ``j + 1``. Every token of the
   chunk then reads each non-empty level ``m``: ``o_t += λ[t, c + m] S^(m)ᵀ query_t``. Leaving the chunk,
   every level is carried through its transition ``Φ_tc``.

Work: ``O(T·C·(K+V))`` inside chunks plus ``O(T·K·V·log(T/C))`` for the levels.

**Prefill.** After the last chunk the counter holds, carried to the last token ``T - 1``, exactly the
token-level Fenwick states of levels ``c + m`` (``m >= 1``). The levels ``0..c`` of the decoding state
hold keys of the last chunk itself: level ``l`` is ``Eᵀ diag(1[level(i, j) = l]) V`` over the chunk's
tokens ``j`` (``i`` the last token's offset, ``E`` the chunk's write keys, :mod:`loglin_edu.chunking`).
Together they are the :class:`~loglin_edu.state.FenwickState` after ``T`` tokens, ready to decode on.
"""

from __future__ import annotations

import torch

from .chunking import ChunkTerms, chunk_terms, split_chunks, wy_factors
from .fenwick import levels_within_chunk, num_chunk_levels, num_levels, trailing_zeros
from .layout import pad_time
from .state import FenwickState


def intra_chunk_scales(level_scales: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``Λ[n, i, j] = λ[nC + i, level(i, j)]`` (0 for ``j > i``), as ``Σ_ℓ λ[nC + i, ℓ] · [level(i, j) = ℓ]``.

    level_scales: ``[B, H, N, C, L]`` (chunked, ``L > log2 C``) -> ``[B, H, N, C, C]``.

    Each entry is one λ times one plus zeros, so the sum is exact. Written so rather than as a gather, its gradient
    is a sum over ``j`` per level, which ``torch.compile`` fuses; a gather's gradient adds every entry back into its
    level one by one (a scatter-add).
    """
    levels = levels_within_chunk(chunk_size, device=level_scales.device)  # [C, C], -1 for j > i
    inner = chunk_size.bit_length()  # levels 0..log2 C
    ell = torch.arange(inner, device=level_scales.device)
    one_hot = (levels[:, None, :] == ell[:, None]).to(level_scales.dtype)  # [C, log2 C + 1, C]
    return (level_scales[..., :inner, None] * one_hot).sum(-2)


def chunk_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    level_scales: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    chunk_size: int = 64,
    return_state: bool = False,
    factors=wy_factors,
    intra_product=None,
) -> torch.Tensor | tuple[torch.Tensor, FenwickState]:
    """Log-linear attention by chunk scan (module docstring), heads-first.

    q, k: ``[B, H, T, K]``; v: ``[B, H, T, V]``; level_scales: ``[B, H, T, L]``; log_decay, beta:
    ``[B, H, T]`` or None. Returns ``[B, H, T, V]``; with ``return_state=True`` also the decoding state
    after the ``T`` tokens (a :class:`~loglin_edu.state.FenwickState` of ``[B, H, K, V]`` levels). factors: how the
    delta rule's WY factors are computed (:func:`~loglin_edu.chunking.chunk_terms`); the decoding state needs
    factors that return ``T_β``. intra_product: how every chunk's ``(A ⊙ M^S ⊙ Λ) V`` is computed from the chunk
    blocks ``[B, H, N, C, C]``, the chunked level scales ``[B, H, N, C, L]`` and values ``[B, H, N, C, V]``; None:
    by PyTorch (:func:`intra_chunk_scales`).
    """
    T = q.shape[2]
    inner = chunk_size.bit_length() - 1  # log2 C
    n_levels = inner + num_chunk_levels(T, chunk_size) + 1
    lam = pad_time(level_scales, max(n_levels, level_scales.shape[-1]), dim=3)  # padded tokens use high levels
    lam = split_chunks(lam, chunk_size)  # [B, H, N, C, L]
    terms = chunk_terms(q, k, v, log_decay, beta, chunk_size, factors)
    values = split_chunks(v, chunk_size)
    if intra_product is None:
        out = (terms.intra * intra_chunk_scales(lam, chunk_size)) @ values
    else:
        out = intra_product(terms.intra, lam, values)

    levels: dict[int, torch.Tensor] = {}  # chunk level m >= 1 -> its state at the current chunk's start
    from_levels = []
    for c in range(out.shape[2]):
        if c > 0:
            j = trailing_zeros(c)
            carried = [terms.own[:, :, c - 1]] + [levels.pop(m) for m in range(1, j + 1) if m in levels]
            levels[j + 1] = sum(carried[1:], carried[0])
        read = torch.zeros_like(out[:, :, c])
        for m, state in levels.items():
            read = read + lam[:, :, c, :, inner + m, None] * (terms.query[:, :, c] @ state)
        from_levels.append(read)
        levels = {m: terms.propagate(c, state) for m, state in levels.items()}
    out = (out + torch.stack(from_levels, dim=2)).flatten(2, 3)[:, :, :T]
    if not return_state:
        return out
    return out, state_after_prefix(terms, levels, v, chunk_size)


def state_after_prefix(
    terms: ChunkTerms, chunk_states: dict[int, torch.Tensor], v: torch.Tensor, chunk_size: int
) -> FenwickState:
    """The decoding state after the ``T`` tokens of a chunk scan (module docstring, **Prefill**).

    terms: the scan's :class:`~loglin_edu.chunking.ChunkTerms`; chunk_states: chunk level ``m`` -> its
    state ``[B, H, K, V]`` carried through the last chunk; v: ``[B, H, T, V]``. Levels ``0..log2 C``
    come from the last chunk's own tokens, level ``log2 C + m`` is chunk level ``m``.
    """
    if terms.write_keys is None:
        raise ValueError("the decoding state of a log-linear scan needs the write keys of its last chunk: chunk terms "
                         "from WY factors without T_β have none (use factors=wy_factors)")
    T = v.shape[2]
    inner = chunk_size.bit_length() - 1
    last_chunk, last_offset = divmod(T - 1, chunk_size)
    in_chunk_level = levels_within_chunk(chunk_size, device=v.device)[last_offset]  # level(i, j), -1 for j > i
    write_keys = terms.write_keys[:, :, last_chunk]  # E: [B, H, C, K]
    values = split_chunks(v, chunk_size)[:, :, last_chunk]  # [B, H, C, V]
    levels: list[torch.Tensor | None] = []
    for lvl in range(num_levels(T)):
        if lvl > inner:
            levels.append(chunk_states.get(lvl - inner))
            continue
        tokens = in_chunk_level == lvl
        levels.append(write_keys[:, :, tokens].transpose(-1, -2) @ values[:, :, tokens] if tokens.any() else None)
    return FenwickState(levels, position=T)
