"""Lagged recall: a stream of bindings where keys are re-bound and asked back at many distances.

In MQAR every answer sits in one block at the start, so at ``T = 256`` a query usually finds the whole
block in a single Fenwick bucket. Here the answers are spread over the past on purpose:

- the sequence is ``T / 2`` slots of two tokens; each sequence uses ``num_keys`` distinct keys;
- a *binding* slot ``(k, v)`` binds key ``k`` (chosen uniformly among the sequence's keys, so keys are
  re-bound again and again) to a fresh random value ``v``;
- ``num_queries`` slots (never slot 0) are *queries* ``(k, filler)``: the label at the key's position is
  the value ``k`` was **last** bound to; the second token is random, unsupervised and drawn below the
  values, never a value — so a query slot cannot be read as a re-binding, and a reader that answers every
  query with the key's latest binding (a slot whose second token is a value) is always right. The key asked is
  the one whose latest binding lies closest to ``lag`` slots back, with ``lag`` drawn log-uniformly from
  ``[1, slot]``: answers sit at every scale of distance, hence in every Fenwick level.

Worked example (a doctest, checked by the tests), 2 keys, 2 queries, keys 1..15, values 16..31::

    >>> s = lagged_recall(1, seq_len=16, num_keys=2, num_queries=2, vocab_size=32, seed=22)
    >>> s.inputs[0].tolist()
    [15, 24, 2, 26, 15, 29, 2, 23, 15, 18, 15, 11, 15, 31, 2, 13]
    >>> s.labels[0].tolist()
    [-100, -100, -100, -100, -100, -100, -100, -100, -100, -100, 18, -100, -100, -100, 23, -100]
    >>> s.source_positions[0].tolist(), s.lags()[0].tolist(), s.levels()[0].tolist()
    ([9, 7], [1, 7], [2, 4])

Key 15 is bound three times (to 24, 29, 18) before it is asked at position 10: the answer is its latest
value 18, shown at position 9 (lag 1, Fenwick level 2). Key 2 was bound to 26, then to 23 at position 7;
asked at position 14, its answer 23 lies 7 tokens back, at level 4 (the bucket {0..7} of query 14).
Tokens 11 and 13 after the queries are filler, drawn below the values (0..15: a value there would look like
a new binding of the key just asked); the binding (15, 31) after the first query changes nothing before it.
"""

from __future__ import annotations


import torch

from .recall import IGNORE_INDEX, RecallSet, distinct_tokens


def lagged_recall(
    num_examples: int,
    seq_len: int = 256,
    num_keys: int = 32,
    num_queries: int = 16,
    vocab_size: int = 8192,
    seed: int = 0,
) -> RecallSet:
    """``num_examples`` lagged-recall sequences (module docstring): a :class:`RecallSet` with ``Q = num_queries``."""
    slots = seq_len // 2
    if seq_len % 2 or not 1 <= num_queries < slots:
        raise ValueError(f"seq_len must be even with 1 <= num_queries < seq_len/2, got {seq_len}, {num_queries}")
    key_vocab = vocab_size // 2
    gen = torch.Generator().manual_seed(seed)
    N, rows = num_examples, torch.arange(num_examples)
    keys = distinct_tokens(N, num_keys, 1, key_vocab, gen)  # [N, num_keys]
    query_slots = 1 + torch.rand(N, slots - 1, generator=gen).topk(num_queries, dim=1).indices.sort(dim=1).values
    is_query = torch.zeros(N, slots, dtype=torch.bool)
    is_query[rows[:, None], query_slots] = True
    # per-slot draws, stored slot-major so that each step reads contiguous rows
    binding_key = torch.randint(0, num_keys, (slots, N), generator=gen)
    binding_value = torch.randint(key_vocab, vocab_size, (slots, N), generator=gen)
    longest = torch.arange(slots).clamp(min=1).log()[:, None]  # lag drawn log-uniformly from [1, slot]
    lag = torch.exp(torch.rand(slots, N, generator=gen, dtype=torch.float64) * longest).floor().long()
    lag = torch.minimum(lag.clamp(min=1), torch.arange(slots).clamp(min=1)[:, None])
    ask_at = is_query.T.contiguous()
    inputs = torch.randint(0, key_vocab, (N, seq_len), generator=gen)  # filler after queries: never a value
    labels = torch.full((N, seq_len), IGNORE_INDEX, dtype=torch.long)
    bound_at = torch.full((N, num_keys), -(10**9), dtype=torch.long)  # slot of each key's latest binding
    bound_to = torch.zeros(N, num_keys, dtype=torch.long)
    source_at = torch.zeros(N, slots, dtype=torch.long)  # for a query slot: where its answer was shown
    for slot in range(slots):
        ask = ask_at[slot]
        # a query asks the key whose latest binding lies closest to `lag` slots back
        asked = (bound_at - (slot - lag[slot])[:, None]).abs().argmin(dim=1)
        key_index = torch.where(ask, asked, binding_key[slot])[:, None]  # a binding: a random key of the sequence
        was_at, was_to = bound_at.gather(1, key_index)[:, 0], bound_to.gather(1, key_index)[:, 0]
        inputs[:, 2 * slot] = keys.gather(1, key_index)[:, 0]
        inputs[:, 2 * slot + 1] = torch.where(ask, inputs[:, 2 * slot + 1], binding_value[slot])
        labels[:, 2 * slot] = torch.where(ask, was_to, IGNORE_INDEX)
        source_at[:, slot] = 2 * was_at + 1
        bound_at.scatter_(1, key_index, torch.where(ask, was_at, slot)[:, None])
        bound_to.scatter_(1, key_index, torch.where(ask, was_to, binding_value[slot])[:, None])
    query_positions = 2 * query_slots
    source_positions = source_at.gather(1, query_slots)
    info = dict(task="lagged_recall", seq_len=seq_len, num_keys=num_keys, num_queries=num_queries,
                vocab_size=vocab_size, seed=seed)
    return RecallSet(inputs, labels, query_positions, source_positions, info)
