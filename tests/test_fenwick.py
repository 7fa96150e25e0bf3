"""The Fenwick partition: buckets tile the prefix, have the promised sizes, and agree with level(t, s)."""

import pytest
import torch

from loglin_edu import fenwick
from loglin_edu.fenwick import bucket, buckets, level, level_matrix, num_levels


def test_buckets_tile_the_prefix_for_every_t_up_to_2_14():
    for t in range(2**14 + 1):
        parts = [b for b in buckets(t) if len(b)]
        assert len(parts) == bin(t).count("1") + 1
        assert parts[0] == range(t, t + 1)  # level 0 is the token itself
        assert all(len(b) & (len(b) - 1) == 0 for b in parts)  # sizes 1, 2^j
        # from the oldest bucket to the newest they are adjacent: disjoint, and together exactly 0..t
        ordered = parts[::-1]
        assert ordered[0].start == 0 and ordered[-1].stop == t + 1
        assert all(a.stop == b.start for a, b in zip(ordered, ordered[1:]))
        for lvl, b in enumerate(buckets(t)):  # the closed form agrees at both ends of every bucket
            if len(b):
                assert level(t, b.start) == lvl and level(t, b[-1]) == lvl
                assert len(b) == (1 if lvl == 0 else 2 ** (lvl - 1))


def test_level_matrix_matches_the_buckets():
    T = 1024
    table = level_matrix(T)
    for t in range(T):
        expect = torch.full((T,), -1, dtype=torch.long)
        for lvl, b in enumerate(buckets(t)):
            expect[b.start : b.stop] = lvl
        assert torch.equal(table[t], expect), t


@pytest.mark.parametrize(
    "T, L", [(1, 1), (2, 2), (3, 3), (4, 3), (5, 4), (8, 4), (9, 5), (16, 5), (17, 6), (64, 7), (65, 8), (16384, 15), (16385, 16)]
)
def test_num_levels_known_values(T, L):
    assert num_levels(T) == L


def test_num_levels_is_the_largest_level_plus_one():
    for T in list(range(1, 300)) + [2**k + d for k in range(9, 15) for d in (-1, 0, 1)]:
        largest = max(level(t, s) for t in (T - 1,) for s in range(0, T))  # the last query reaches furthest
        assert num_levels(T) == largest + 1, T


def test_bucket_of_a_clear_bit_is_empty_and_examples():
    assert [list(b) for b in buckets(6)] == [[6], [], [4, 5], [0, 1, 2, 3]]
    assert [list(b) for b in buckets(7)] == [[7], [6], [4, 5], [0, 1, 2, 3]]
    assert list(bucket(8, 2)) == []


def test_chunk_levels_split_token_levels():
    C = 8
    inner = 3
    for t in range(200):
        for s in range(t + 1):
            if t // C == s // C:
                assert level(t, s) <= inner
                assert level(t, s) == fenwick.levels_within_chunk(C)[t % C, s % C]
            else:
                assert level(t, s) == inner + fenwick.chunk_level(t // C, s // C)


def test_num_chunk_levels_covers_every_pair():
    for T in range(1, 300):
        for C in (1, 4, 64):
            inner = C.bit_length() - 1
            assert inner + fenwick.num_chunk_levels(T, C) + 1 >= num_levels(T)


@pytest.mark.parametrize(
    "call",
    [lambda: level(3, 4), lambda: level(3, -1), lambda: num_levels(0), lambda: bucket(-1, 0), lambda: fenwick.trailing_zeros(0),
     lambda: fenwick.chunk_level(2, 2)],
)
def test_invalid_positions_raise(call):
    with pytest.raises(ValueError):
        call()


def test_trailing_zeros():
    assert [fenwick.trailing_zeros(t) for t in range(1, 9)] == [0, 1, 0, 2, 0, 1, 0, 3]
