"""The Fenwick partition of a causal prefix into power-of-two buckets.

For a query position ``t`` the keys ``0..t`` are split into disjoint buckets, one per *level*:

    level(t, t) = 0
    level(t, s) = bit_length(t XOR s)        for s < t

Bucket ``l >= 1`` of query ``t`` is non-empty iff bit ``l - 1`` of ``t`` is set; it then holds the
``2**(l-1)`` keys that agree with ``t`` above bit ``l - 1`` and have that bit clear. A length-``T``
sequence uses ``L(T) = bit_length(T - 1) + 1`` levels.

Positions are 0-indexed throughout. Nothing here depends on the sequence length except
:func:`num_levels` and the shapes of the tables.
"""

from __future__ import annotations

import torch

__all__ = [
    "level",
    "num_levels",
    "bucket",
    "buckets",
    "level_matrix",
    "levels_within_chunk",
    "chunk_level",
    "num_chunk_levels",
    "trailing_zeros",
    "bit_length",
]


def level(t: int, s: int) -> int:
    """Level of key ``s`` for query ``t``: 0 if ``s == t``, else ``bit_length(t ^ s)``.

    Raises ``ValueError`` unless ``0 <= s <= t`` (a query never reads a later key).
    """
    if not 0 <= s <= t:
        raise ValueError(f"level(t, s) needs 0 <= s <= t, got t={t}, s={s}")
    return (t ^ s).bit_length()


def num_levels(seq_len: int) -> int:
    """``L(T) = bit_length(T - 1) + 1``: levels a length-``T`` sequence needs (1 for T=1, 15 for 16384).

    The largest level any pair reaches is ``level(T-1, 0) = bit_length(T-1)``; level 0 is the token itself.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return (seq_len - 1).bit_length() + 1


def bucket(t: int, lvl: int) -> range:
    """Keys of query ``t`` at level ``lvl`` as a ``range`` (empty when bit ``lvl-1`` of ``t`` is clear).

    level 0 -> ``{t}``; level ``l >= 1`` -> ``[(t >> l) << l, ((t >> l) << l) + 2**(l-1))`` if bit ``l-1`` of
    ``t`` is set.
    """
    if t < 0 or lvl < 0:
        raise ValueError(f"bucket needs t >= 0 and lvl >= 0, got t={t}, lvl={lvl}")
    if lvl == 0:
        return range(t, t + 1)
    if not (t >> (lvl - 1)) & 1:
        return range(0)
    start = (t >> lvl) << lvl
    return range(start, start + (1 << (lvl - 1)))


def buckets(t: int) -> list[range]:
    """All buckets of query ``t``, indexed by level ``0..bit_length(t)`` (some may be empty)."""
    return [bucket(t, lvl) for lvl in range(t.bit_length() + 1)]


def bit_length(x: torch.Tensor) -> torch.Tensor:
    """Elementwise ``bit_length`` of a non-negative int64 tensor, by binary search over 64 bits."""
    out = torch.zeros_like(x)
    rest = x.clone()
    for shift in (32, 16, 8, 4, 2, 1):
        big = rest >= (1 << shift)
        out += big * shift
        rest = torch.where(big, rest >> shift, rest)
    return out + (rest > 0)


def level_matrix(seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[T, T]`` int64 table of ``level(t, s)`` for ``s <= t`` and ``-1`` above the diagonal.

    Quadratic in ``T`` by nature: meant for pictures, masks and the naive form, never for the
    chunkwise algorithm (which uses :func:`levels_within_chunk` and :func:`chunk_level`).
    """
    pos = torch.arange(seq_len, device=device)
    lv = bit_length(pos[:, None] ^ pos[None, :])
    return torch.where(pos[:, None] >= pos[None, :], lv, torch.full_like(lv, -1))


def levels_within_chunk(chunk_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[C, C]`` level table shared by every aligned chunk: ``level(i, j)`` for in-chunk offsets.

    For ``t = c*C + i`` and ``s = c*C + j`` in the same aligned chunk (``C`` a power of two),
    ``t ^ s = i ^ j``, so every chunk has the same pattern, with levels ``0..log2(C)``.
    """
    return level_matrix(chunk_size, device=device)


def chunk_level(query_chunk: int, key_chunk: int) -> int:
    """Level between two different chunks, counted in chunks: ``bit_length(tc ^ sc)``.

    The token level of such a pair is ``log2(C) + chunk_level(tc, sc)``.
    """
    if not 0 <= key_chunk < query_chunk:
        raise ValueError(f"chunk_level needs 0 <= key_chunk < query_chunk, got {query_chunk}, {key_chunk}")
    return (query_chunk ^ key_chunk).bit_length()


def num_chunk_levels(seq_len: int, chunk_size: int) -> int:
    """Chunk levels ``1..n`` the inter-chunk stage needs: ``n = bit_length(N - 1)``, ``N = ceil(T / C)``."""
    n_chunks = -(-seq_len // chunk_size)
    return (n_chunks - 1).bit_length()


def trailing_zeros(t: int) -> int:
    """Number of trailing zero bits of ``t >= 1``: the level a binary counter carries into at step ``t``."""
    if t < 1:
        raise ValueError(f"trailing_zeros needs t >= 1, got {t}")
    return (t & -t).bit_length() - 1
