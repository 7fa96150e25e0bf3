"""Chapter 7: which stage of the chunk scan computes a pair, and which key chunks a query chunk reads."""

from __future__ import annotations

from ..fenwick import bucket, chunk_level, level
from .checking import Case, Exercise, call


def stage(t: int, s: int, chunk_size: int) -> tuple[str, int]:
    """``("intra", level(t, s))`` when ``t`` and ``s`` share an aligned chunk, else ``("inter", m)`` with the chunk
    level ``m = bit_length(t // C XOR s // C)`` (then ``level(t, s) = log2(C) + m``).
    """
    if t // chunk_size == s // chunk_size:
        return "intra", level(t, s)
    return "inter", chunk_level(t // chunk_size, s // chunk_size)


def _stage_in_tokens(t: int, s: int, chunk_size: int) -> tuple[str, int]:
    where, _ = stage(t, s, chunk_size)
    return where, level(t, s)


def _pairs(rng):
    for _ in range(6):
        T, C = rng.randint(2, 100), 2 ** rng.randint(0, 4)
        yield Case(([(t, s) for t in range(T) for s in range(t + 1)], C), f"T={T}, C={C}")


STAGE = Exercise(
    name="chunk_scan.stage",
    chapter=7,
    signature="stage(t, s, chunk_size) -> (str, int)",
    task="Say which stage of the chunk scan computes the pair `(t, s)`, `s <= t`: `(\"intra\", level)` when both "
         "lie in one aligned chunk of `chunk_size` tokens, else `(\"inter\", m)` with `m` the level counted in "
         "chunks.",
    solution=stage,
    cases=_pairs,
    driver=lambda fn, pairs, C: {pair: tuple(call(fn, *pair, C)) for pair in pairs},
    mistakes=((_stage_in_tokens, "count the inter-chunk level in chunks: m = bit_length(t//C XOR s//C), "
                                 "so that level(t, s) = log2(C) + m."),),
)


def chunk_sources(c: int) -> dict[int, range]:
    """Key chunks query chunk ``c`` reads from a state, by chunk level ``m``: the Fenwick buckets of ``c``
    counted in chunks (only the non-empty ones, ``m >= 1``).
    """
    return {m: bucket(c, m) for m in range(1, c.bit_length() + 1) if len(bucket(c, m))}


def _sources_with_empty_levels(c: int) -> dict[int, range]:
    return {m: bucket(c, m) for m in range(1, c.bit_length() + 1)}


def _chunks(rng):
    yield Case((list(range(64)),), "every chunk c < 64")
    yield Case(([rng.randrange(64, 5000) for _ in range(30)],), "30 random chunks below 5000")


CHUNK_SOURCES = Exercise(
    name="chunk_scan.chunk_sources",
    chapter=7,
    signature="chunk_sources(c) -> dict[int, range]",
    task="For query chunk `c`, return `{m: key chunks}` for every chunk level `m >= 1` at which chunk `c` reads a "
         "state, with the range of earlier chunks folded into that state.",
    solution=chunk_sources,
    cases=_chunks,
    driver=lambda fn, chunks: {c: {m: list(r) for m, r in call(fn, c).items()} for c in chunks},
    mistakes=((_sources_with_empty_levels, "list only the levels a chunk reads: level m is there when bit m-1 "
                                           "of c is set."),),
)

EXERCISES = (STAGE, CHUNK_SOURCES)
