"""A set of recall sequences: inputs, labels, and where each query and its answer sit.

Every sequence of a set has the same number ``Q`` of queries, so a batch of ``B`` sequences always holds
``B · Q`` supervised positions (no padding, no data-dependent shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..fenwick import bit_length

IGNORE_INDEX = -100


@dataclass
class RecallSet:
    """``N`` sequences of length ``T`` with ``Q`` queries each.

    inputs: ``[N, T]`` token ids; labels: ``[N, T]``, the answer at each query position and
    ``IGNORE_INDEX`` (-100) everywhere else; query_positions: ``[N, Q]`` where the queries sit;
    source_positions: ``[N, Q]`` where each query's answer was last shown (the token a model must
    read back); info: how the set was made.
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    query_positions: torch.Tensor
    source_positions: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def seq_len(self) -> int:
        return self.inputs.shape[1]

    @property
    def num_queries(self) -> int:
        return self.query_positions.shape[1]

    @property
    def answers(self) -> torch.Tensor:
        """``[N, Q]``: the label of every query."""
        return self.labels.gather(1, self.query_positions)

    def lags(self) -> torch.Tensor:
        """``[N, Q]``: distance in tokens from each answer's source to its query."""
        return self.query_positions - self.source_positions

    def levels(self) -> torch.Tensor:
        """``[N, Q]``: the Fenwick level of each answer's source seen from its query, ``level(t, s)``."""
        return bit_length(self.query_positions ^ self.source_positions)

    def select(self, rows: torch.Tensor) -> "RecallSet":
        """The sequences ``rows`` (a 1-D index tensor on this set's device)."""
        return RecallSet(
            self.inputs[rows], self.labels[rows], self.query_positions[rows], self.source_positions[rows], self.info
        )

    def to(self, device: torch.device | str) -> "RecallSet":
        return RecallSet(
            self.inputs.to(device), self.labels.to(device), self.query_positions.to(device),
            self.source_positions.to(device), self.info,
        )


def drop_repeats(held_out: RecallSet, seen: list[RecallSet]) -> RecallSet:
    """The sequences of ``held_out`` that appear in none of ``seen`` and not earlier in ``held_out`` itself.

    Sequences are compared by their inputs (the labels follow from them). A validation or test set filtered
    this way shares no sequence with the sets it is held out from.
    """
    def rows(s: RecallSet) -> list[bytes]:
        return [row.tobytes() for row in s.inputs.cpu().numpy()]

    known = {row for s in seen for row in rows(s)}
    keep = []
    for i, row in enumerate(rows(held_out)):
        if row not in known:
            keep.append(i)
            known.add(row)
    if len(keep) == len(held_out):
        return held_out
    return held_out.select(torch.tensor(keep, dtype=torch.long, device=held_out.inputs.device))


def distinct_tokens(num_rows: int, count: int, low: int, high: int, generator: torch.Generator) -> torch.Tensor:
    """``[num_rows, count]`` tokens drawn without replacement from ``[low, high)`` in each row, in random order.

    Rows are drawn with replacement and drawn again while they hold a repeat (rejection sampling: every
    ordered tuple of distinct tokens is equally likely); a nearly full draw uses random scores' top-k.
    """
    size = high - low
    if count > size:
        raise ValueError(f"cannot draw {count} distinct tokens from [{low}, {high})")
    if count * count > size:  # repeats are likely: rank random scores instead
        return low + torch.rand(num_rows, size, generator=generator).topk(count, dim=1).indices
    out = torch.randint(low, high, (num_rows, count), generator=generator)
    while True:
        repeats = (out.sort(dim=1).values.diff(dim=1) == 0).any(dim=1)
        if not repeats.any():
            return out
        out[repeats] = torch.randint(low, high, (int(repeats.sum()), count), generator=generator)
