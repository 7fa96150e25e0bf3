"""Batches of recall sets: which rows a member sees at a step (a pure function), and the supervised positions.

Every sequence of a :class:`~loglin_edu.data.RecallSet` has the same number of queries, so a batch has a
fixed number of supervised positions: no padding, no data-dependent shapes.
"""

from __future__ import annotations

import torch

from ..data.recall import RecallSet


def batch_rows(seed: int, set_index: int, step: int, num_rows: int, count: int) -> torch.Tensor:
    """Rows of training set ``set_index`` that a member with ``seed`` sees at ``step`` (a pure function)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + set_index * 10_007 + step) % (2**63))
    return torch.randint(num_rows, (count,), generator=gen)


def gather_batch(sets: list[RecallSet], rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch from ``rows[i]`` of ``sets[i]`` (sets of one length T); ``rows[i]``: ``[..., b_i]``.

    Returns tokens ``[..., B, T]`` (``B = Σ b_i``), positions ``[..., N]`` (flat indices of the queries
    into ``B · T``) and answers ``[..., N]``; ``N = Σ_i b_i · Q_i`` does not depend on the data.
    """
    tokens, positions, answers, offset = [], [], [], 0
    for s, r in zip(sets, rows):
        r = r.to(s.inputs.device)
        query_positions = s.query_positions[r]  # [..., b, Q]
        tokens.append(s.inputs[r])
        answers.append(s.labels[r].gather(-1, query_positions).flatten(-2))
        row_start = (offset + torch.arange(r.shape[-1], device=r.device))[:, None] * s.seq_len
        positions.append((row_start + query_positions).flatten(-2))
        offset += r.shape[-1]
    return torch.cat(tokens, -2), torch.cat(positions, -1), torch.cat(answers, -1)
