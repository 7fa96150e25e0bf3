"""Multi-query associative recall (MQAR), with the semantics of Zoology (Arora et al., 2023).

The vocabulary is split in two: keys ``[1, V/2)`` and values ``[V/2, V)``. A sequence starts with ``P``
key–value pairs, distinct keys with distinct values; then each key is asked once, at an even offset of
the rest of the sequence drawn without replacement from a power law ``p(gap = i) ∝ i^(a-1)`` (``a = 0.01``:
most queries come soon after the pairs); every other position holds a random token. Only the query
positions are supervised: the label there is the key's value, elsewhere the ignore index -100.

Worked example (a doctest, checked by the tests), keys 1..15, values 16..31::

    >>> s = mqar(1, seq_len=16, num_pairs=2, vocab_size=32, seed=0)
    >>> s.inputs[0].tolist()
    [15, 21, 10, 16, 15, 19, 21, 18, 4, 23, 10, 24, 24, 12, 26, 1]
    >>> s.labels[0].tolist()
    [-100, -100, -100, -100, 21, -100, -100, -100, -100, -100, 16, -100, -100, -100, -100, -100]

The pairs are (15 → 21) and (10 → 16). Key 15 is asked at position 4 (label 21), key 10 at position 10
(label 16). Every other position after the pairs is random filler, unsupervised (-100); a filler token
may happen to equal a key or a value (21 at position 6), as in Zoology.
"""

from __future__ import annotations

import torch

from .recall import IGNORE_INDEX, RecallSet, distinct_tokens


def power_law_slots(num_rows: int, count: int, space: int, power_a: float, generator: torch.Generator) -> torch.Tensor:
    """``[num_rows, count]`` distinct slots in ``[0, space)`` drawn without replacement with
    ``p(slot i) ∝ (i + 1)^(a - 1)`` (the Gumbel top-k trick: ``argtop_k(log p + Gumbel noise)``)."""
    if count > space:
        raise ValueError(f"cannot place {count} queries in {space} slots")
    log_p = (power_a - 1) * torch.log(torch.arange(1, space + 1, dtype=torch.float64))
    u = torch.rand(num_rows, space, generator=generator, dtype=torch.float64).clamp_min(1e-300)
    return (log_p - torch.log(-torch.log(u))).topk(count, dim=1).indices


def mqar(
    num_examples: int,
    seq_len: int = 256,
    num_pairs: int = 16,
    vocab_size: int = 8192,
    power_a: float = 0.01,
    seed: int = 0,
) -> RecallSet:
    """``num_examples`` MQAR sequences (module docstring) as a :class:`RecallSet` with ``Q = num_pairs``."""
    if seq_len % 2 or 4 * num_pairs > seq_len:
        raise ValueError(f"seq_len must be even and >= 4 · num_pairs, got seq_len={seq_len}, num_pairs={num_pairs}")
    key_vocab = vocab_size // 2
    if num_pairs >= key_vocab:
        raise ValueError(f"num_pairs={num_pairs} needs a vocabulary of more than {2 * num_pairs + 2} tokens")
    gen = torch.Generator().manual_seed(seed)
    N, P = num_examples, num_pairs
    keys = distinct_tokens(N, P, 1, key_vocab, gen)
    values = distinct_tokens(N, P, key_vocab, vocab_size, gen)
    inputs = torch.randint(0, vocab_size, (N, seq_len), generator=gen)  # random filler everywhere first
    inputs[:, 0 : 2 * P : 2] = keys
    inputs[:, 1 : 2 * P : 2] = values
    slots = power_law_slots(N, P, (seq_len - 2 * P) // 2, power_a, gen)
    query_positions = 2 * P + 2 * slots  # query j asks key j
    inputs.scatter_(1, query_positions, keys)
    labels = torch.full((N, seq_len), IGNORE_INDEX, dtype=torch.long)
    labels.scatter_(1, query_positions, values)
    source_positions = (2 * torch.arange(P) + 1).expand(N, P)  # the value token of pair j
    info = dict(task="mqar", seq_len=seq_len, num_pairs=P, vocab_size=vocab_size, power_a=power_a, seed=seed)
    return RecallSet(inputs, labels, query_positions, source_positions.clone(), info)
