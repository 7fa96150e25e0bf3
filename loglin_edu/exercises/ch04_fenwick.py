"""Chapter 4: the Fenwick partition — the level of a pair, the buckets of a query, the number of levels."""

from __future__ import annotations

from .. import fenwick
from .checking import Case, Exercise, call


def level(t: int, s: int) -> int:
    """``level(t, t) = 0``; ``level(t, s) = bit_length(t XOR s)`` for ``s < t``."""
    return (t ^ s).bit_length()


def _level_from_distance(t: int, s: int) -> int:
    return (t - s).bit_length()


def _level_zero_based(t: int, s: int) -> int:
    return max((t ^ s).bit_length() - 1, 0)


def _pairs(rng):
    yield Case(([(t, s) for t in range(33) for s in range(t + 1)],), "every pair with t < 33")
    big = [rng.randrange(1, 2**40) for _ in range(200)]
    yield Case(([(t, rng.randrange(t + 1)) for t in big],), "200 random pairs with t < 2**40")


LEVEL = Exercise(
    name="fenwick.level",
    chapter=4,
    signature="level(t, s) -> int",
    task="Return the Fenwick level of key `s` for query `t` (`0 <= s <= t`): 0 for `s == t`, otherwise the "
         "1-based index of the highest bit in which `t` and `s` differ.",
    solution=level,
    cases=_pairs,
    driver=lambda fn, pairs: {pair: call(fn, *pair) for pair in pairs},
    reference=lambda pairs: {pair: fenwick.level(*pair) for pair in pairs},
    mistakes=(
        (_level_from_distance, "use t XOR s, not the distance t - s: buckets are aligned to powers of two, "
                               "so keys at the same distance can sit in different buckets."),
        (_level_zero_based, "levels are 1-based above the diagonal: level(t, s) = bit_length(t XOR s) and "
                            "level 0 is the query's own key only."),
    ),
)


def buckets(t: int) -> list[range]:
    """Keys of query ``t`` by level ``0..bit_length(t)``: ``{t}``, then for each set bit ``l - 1`` of ``t`` the
    ``2**(l-1)`` keys that agree with ``t`` above bit ``l - 1`` and have it clear (an empty range otherwise).
    """
    out = [range(t, t + 1)]
    for lvl in range(1, t.bit_length() + 1):
        start = (t >> lvl) << lvl
        out.append(range(start, start + (1 << (lvl - 1))) if t >> (lvl - 1) & 1 else range(0))
    return out


def _nonempty_buckets(t: int) -> list[range]:
    return [b for b in buckets(t) if len(b)]


def _queries(rng):
    yield Case((list(range(70)),), "every query t < 70")
    yield Case(([rng.randrange(70, 5000) for _ in range(40)],), "40 random queries below 5000")


BUCKETS = Exercise(
    name="fenwick.buckets",
    chapter=4,
    signature="buckets(t) -> list of ranges",
    task="Return the buckets of query `t` indexed by level `0..bit_length(t)`: item `l` holds the keys "
         "`s <= t` with `level(t, s) = l` (an empty range when there are none).",
    solution=buckets,
    cases=_queries,
    driver=lambda fn, queries: {t: [list(b) for b in call(fn, t)] for t in queries},
    reference=lambda queries: {t: [list(b) for b in fenwick.buckets(t)] for t in queries},
    mistakes=((_nonempty_buckets, "keep an empty bucket for every clear bit of t, so that item l is level l."),),
)


def num_levels(seq_len: int) -> int:
    """Levels a length-``T`` sequence needs: the largest is ``level(T-1, 0) = bit_length(T-1)``, plus level 0."""
    return (seq_len - 1).bit_length() + 1


def _num_levels_floor(seq_len: int) -> int:
    return seq_len.bit_length()


def _num_levels_ceil(seq_len: int) -> int:
    return seq_len.bit_length() + 1


def _lengths(rng):
    special = sorted({n for k in range(15) for n in (2**k - 1, 2**k, 2**k + 1) if n >= 1})
    yield Case((special,), "T = 1, 2, 3 and every power of two up to 2**14 with its neighbours")
    yield Case(([rng.randrange(1, 10**6) for _ in range(100)],), "100 random lengths")


NUM_LEVELS = Exercise(
    name="fenwick.num_levels",
    chapter=4,
    signature="num_levels(T) -> int",
    task="Return how many levels (λ values per query) a length-`T` sequence needs: 1 for `T = 1`, 15 for "
         "`T = 16384`.",
    solution=num_levels,
    cases=_lengths,
    driver=lambda fn, lengths: {T: call(fn, T) for T in lengths},
    reference=lambda lengths: {T: fenwick.num_levels(T) for T in lengths},
    mistakes=(
        (_num_levels_floor, "bit_length(T) is one level short unless T is a power of two: the largest level "
                            "is level(T-1, 0) = bit_length(T-1), and level 0 comes on top."),
        (_num_levels_ceil, "a power of two T = 2**k needs only k + 1 levels: the largest level is "
                           "level(T-1, 0) = bit_length(T-1) = k."),
    ),
)

EXERCISES = (LEVEL, BUCKETS, NUM_LEVELS)
