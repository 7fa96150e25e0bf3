"""The recall generators: Zoology's MQAR invariants, the lagged-recall invariants, the worked examples."""

import doctest
import importlib

import pytest
import torch

import loglin_edu as le
from loglin_edu.data import IGNORE_INDEX, lagged_recall, mqar


@pytest.mark.parametrize("module", ["loglin_edu.data.multiquery", "loglin_edu.data.lagged"])
def test_worked_examples_in_the_docstrings(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted >= 3 and result.failed == 0


@pytest.mark.parametrize("seq_len, pairs, vocab", [(64, 4, 128), (256, 64, 8192), (256, 16, 8192), (34, 8, 40)])
def test_mqar_invariants(seq_len, pairs, vocab):
    s = mqar(200, seq_len, pairs, vocab, seed=pairs)
    x, y = s.inputs, s.labels
    keys, values = x[:, 0 : 2 * pairs : 2], x[:, 1 : 2 * pairs : 2]
    half = vocab // 2
    assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < vocab)).all()
    assert (keys.sort(1).values.diff(dim=1) != 0).all(), "keys of a sequence are distinct"
    assert (values.sort(1).values.diff(dim=1) != 0).all(), "values of a sequence are distinct"
    assert ((x >= 0) & (x < vocab)).all()
    # only the queries are supervised, each exactly once per key, after the pairs, at even offsets
    supervised = y != IGNORE_INDEX
    assert (supervised.sum(1) == pairs).all()
    assert torch.equal(supervised, torch.zeros_like(supervised).scatter_(1, s.query_positions, True))
    assert (s.query_positions >= 2 * pairs).all() and (s.query_positions % 2 == 0).all()
    for n in range(len(s)):
        table = dict(zip(keys[n].tolist(), values[n].tolist()))
        for t in s.query_positions[n].tolist():
            assert y[n, t].item() == table[x[n, t].item()], "every query's label is its key's value"
    assert (x.gather(1, s.source_positions) == s.answers).all(), "the source position holds the answer"


def test_mqar_queries_follow_a_power_law():
    s = mqar(2000, 256, 8, 8192, seed=0)
    slot = (s.query_positions - 16) // 2  # 0..119
    near, far = (slot < 30).sum().item(), (slot >= 90).sum().item()
    assert near > 2 * far, (near, far)


def test_mqar_is_seeded():
    assert torch.equal(mqar(5, seed=1).inputs, mqar(5, seed=1).inputs)
    assert not torch.equal(mqar(5, seed=1).inputs, mqar(5, seed=2).inputs)


@pytest.mark.parametrize("kwargs", [dict(seq_len=63), dict(seq_len=64, num_pairs=17), dict(vocab_size=16, num_pairs=8, seq_len=64)])
def test_mqar_rejects_impossible_settings(kwargs):
    with pytest.raises(ValueError):
        mqar(2, **kwargs)


def last_binding(seq: list[int], t: int, key: int):
    """Plain loop: the value bound to ``key`` by the latest binding (key, value) before position t."""
    for s in range(t - 2, -1, -2):
        if seq[s] == key and s + 1 < t:
            return s + 1
    return None


@pytest.mark.parametrize("seq_len, keys, queries", [(256, 32, 16), (64, 4, 8), (16, 2, 2)])
def test_lagged_recall_invariants(seq_len, keys, queries):
    s = lagged_recall(100, seq_len, keys, queries, vocab_size=512, seed=seq_len + keys)
    x, y = s.inputs, s.labels
    supervised = y != IGNORE_INDEX
    assert (supervised.sum(1) == queries).all()
    assert torch.equal(supervised, torch.zeros_like(supervised).scatter_(1, s.query_positions, True))
    assert (s.query_positions % 2 == 0).all() and (s.query_positions > 0).all()
    assert (s.lags() >= 1).all()
    for n in range(len(s)):
        seq = x[n].tolist()
        query_set = set(s.query_positions[n].tolist())
        bindings = [(seq[2 * i], seq[2 * i + 1]) for i in range(seq_len // 2) if 2 * i not in query_set]
        assert len({k for k, _ in bindings}) <= keys
        for t, src in zip(s.query_positions[n].tolist(), s.source_positions[n].tolist()):
            key = seq[t]
            # the answer is the latest *binding* of the key (queries re-show keys but bind nothing)
            latest = next(p + 1 for p in range(t - 2, -1, -2) if seq[p] == key and p not in query_set)
            assert src == latest and seq[src] == y[n, t].item()


def best_reader(seq: list[int], t: int, value_start: int) -> int | None:
    """The best a model can do at query position t, reading seq[0..t] only: the value of the key's latest
    binding, a slot (key, value) before t whose second token is a value."""
    for s in range(t - 2, -1, -2):
        if seq[s] == seq[t] and seq[s + 1] >= value_start:
            return seq[s + 1]
    return None


@pytest.mark.parametrize("seq_len, keys, queries, vocab", [(256, 32, 16, 8192), (64, 4, 8, 32), (32, 2, 6, 16)])
def test_best_reader_answers_every_lagged_query(seq_len, keys, queries, vocab):
    """Filler after a query is never a value, so a query slot never looks like a re-binding: the best reader
    scores 100 % (small vocabularies make every kind of collision frequent)."""
    s = lagged_recall(300, seq_len, keys, queries, vocab_size=vocab, seed=vocab + keys)
    assert (s.inputs[:, 1::2].gather(1, s.query_positions // 2) < vocab // 2).all()  # filler below the values
    right = total = 0
    for n in range(len(s)):
        seq = s.inputs[n].tolist()
        for t, answer in zip(s.query_positions[n].tolist(), s.answers[n].tolist()):
            right += best_reader(seq, t, vocab // 2) == answer
            total += 1
    assert right == total


def test_lagged_recall_spreads_answers_over_the_fenwick_levels():
    s = lagged_recall(500, 256, 32, 16, seed=0)
    counts = torch.bincount(s.levels().flatten(), minlength=9)
    assert (counts[2:9] > 0.05 * counts.sum()).all(), counts  # every level 2..8 holds >5% of the answers


@pytest.mark.parametrize("pairs", [4, 8, 16, 32, 64])
def test_mqar_puts_all_pairs_in_one_fenwick_bucket_of_every_query(pairs):
    """With P a power of two, the block 0..2P-1 is one whole bucket of every query t >= 2P."""
    s = mqar(50, 256, pairs, seed=pairs)
    for t in s.query_positions.flatten().unique().tolist():
        assert len({le.level(t, src) for src in range(2 * pairs)}) == 1


def test_levels_follow_the_fenwick_convention():
    s = lagged_recall(20, 64, 4, 8, seed=1)
    for q, src, lvl in zip(s.query_positions.flatten().tolist(), s.source_positions.flatten().tolist(),
                           s.levels().flatten().tolist()):
        assert lvl == le.level(q, src)


def test_select_and_to_keep_the_pieces_together():
    s = mqar(10, 64, 4, 128, seed=0)
    sub = s.select(torch.tensor([3, 7])).to("cpu")
    assert torch.equal(sub.inputs, s.inputs[[3, 7]]) and torch.equal(sub.answers, s.answers[[3, 7]])
    assert len(sub) == 2 and sub.num_queries == 4 and sub.seq_len == 64
