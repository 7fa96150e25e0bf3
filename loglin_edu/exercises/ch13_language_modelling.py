"""Chapter 13: language modelling — the rows a data-parallel rank trains on, the loss at each position, and
which Fenwick buckets of a query hold keys (where a learned λ is read)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data.token_stream import micro_batch_rows as package_rows
from ..train.lm_measures import nonempty_levels as package_nonempty_levels
from .checking import Case, Exercise, call, describe, tensor_cases


def micro_batch_rows(batch_size: int, world_size: int, micro_steps: int, rank: int, micro_step: int) -> range:
    """Rank ``r`` owns the contiguous block of ``B / W`` rows starting at ``r · B / W``; inside it, accumulation
    step ``a`` takes the ``a``-th block of ``B / (W · A)`` rows."""
    share = batch_size // (world_size * micro_steps)
    first = rank * (batch_size // world_size) + micro_step * share
    return range(first, first + share)


def _rows_interleaved(batch_size, world_size, micro_steps, rank, micro_step):
    share = batch_size // (world_size * micro_steps)
    first = (micro_step * world_size + rank) * share
    return range(first, first + share)


def _rows_ignoring_accumulation(batch_size, world_size, micro_steps, rank, micro_step):
    per_rank = batch_size // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def _splits(rng):
    settings = [(8, 2, 2), (8, 1, 4), (12, 3, 2), (16, 4, 1), (32, 2, 4)]
    for _ in range(3):
        w, a = rng.choice([1, 2, 4]), rng.choice([1, 2, 3])
        settings.append((w * a * rng.randint(1, 4), w, a))
    for B, W, A in settings:
        yield Case(([(B, W, A, r, m) for r in range(W) for m in range(A)],), f"B={B}, W={W}, A={A}")


MICRO_BATCH_ROWS = Exercise(
    name="lm.micro_batch_rows",
    chapter=13,
    signature="micro_batch_rows(batch_size, world_size, micro_steps, rank, micro_step) -> range",
    task="The global batch of a step has `batch_size` rows. Return the rows (a `range`) that rank `rank` of "
         "`world_size` data-parallel ranks trains on at accumulation step `micro_step` of `micro_steps`: each rank "
         "owns one contiguous block of `batch_size / world_size` rows, cut into `micro_steps` equal blocks.",
    solution=micro_batch_rows,
    cases=_splits,
    driver=lambda fn, args: {a: list(call(fn, *a)) for a in args},
    reference=lambda args: {a: list(package_rows(*a)) for a in args},
    mistakes=(
        (_rows_interleaved, "the rank comes first: rank r's rows are one contiguous block starting at r · B / W, "
                            "whatever the number of accumulation steps."),
        (_rows_ignoring_accumulation, "with accumulation each forward pass takes only B / (W · A) rows: the "
                                      "micro_step-th block inside the rank's rows."),
    ),
)


def loss_by_position(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``loss(t) = mean_b -log softmax(logits[b, t])[tokens[b, t + 1]]``; logits ``[B, T, V]``, tokens
    ``[B, T + 1]`` -> ``[T]``."""
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none").mean(0)


def _loss_unshifted(logits, tokens):
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, :-1], reduction="none").mean(0)


def _loss_mean_over_positions(logits, tokens):
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none").mean(1)


def _logit_cases(rng):
    for sizes, seed in tensor_cases(rng, count=8):
        gen = torch.Generator().manual_seed(seed)
        B, T, V = sizes["B"] + 1, sizes["T"] + 1, 3 + sizes["V"]
        if B == T:
            T += 1
        logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64)
        tokens = torch.randint(V, (B, T + 1), generator=gen)
        yield Case((logits, tokens), describe(dict(B=B, T=T, V=V)))


LOSS_BY_POSITION = Exercise(
    name="lm.loss_by_position",
    chapter=13,
    signature="loss_by_position(logits, tokens) -> tensor [T]",
    task="`logits: [B, T, V]` are a model's outputs on `tokens[:, :T]`, with `tokens: [B, T + 1]`. Return the "
         "mean over the batch of the next-token cross-entropy at each position `t` (the target of position `t` "
         "is `tokens[:, t + 1]`).",
    solution=loss_by_position,
    cases=_logit_cases,
    mistakes=(
        (_loss_unshifted, "the target of position t is the next token, tokens[:, t + 1]: the model at t has read "
                          "tokens up to t and predicts what follows."),
        (_loss_mean_over_positions, "average over the batch (dimension 0), keeping one value per position."),
    ),
)


def nonempty_levels(seq_len: int, levels: int) -> torch.Tensor:
    """``[T, L]`` bool: level 0 always holds the query itself; level ``ℓ >= 1`` holds keys iff bit ``ℓ - 1`` of
    ``t`` is set."""
    t = torch.arange(seq_len)[:, None]
    lvl = torch.arange(1, levels)[None, :]
    return torch.cat([torch.ones(seq_len, 1, dtype=torch.bool), ((t >> (lvl - 1)) & 1).bool()], dim=1)


def _levels_wrong_bit(seq_len, levels):
    t = torch.arange(seq_len)[:, None]
    return ((t >> torch.arange(levels)[None, :]) & 1).bool()


def _levels_by_size(seq_len, levels):
    t = torch.arange(seq_len)[:, None]
    return (2 ** torch.arange(levels)[None, :] // 2) <= t + 1


def _level_cases(rng):
    yield Case((16, 6), "T=16, L=6")
    yield Case((1, 1), "T=1, L=1")
    for _ in range(4):
        T = rng.randint(2, 300)
        yield Case((T, T.bit_length() + rng.randint(0, 2)), f"T={T}")


NONEMPTY_LEVELS = Exercise(
    name="lm.nonempty_levels",
    chapter=13,
    signature="nonempty_levels(seq_len, levels) -> bool tensor [T, L]",
    task="Return a `[seq_len, levels]` boolean table: entry `[t, l]` is True when the Fenwick bucket of level "
         "`l` of query `t` holds at least one key — the positions where a learned λ[t, l] is read.",
    solution=nonempty_levels,
    cases=_level_cases,
    reference=lambda T, L: package_nonempty_levels(T, L),
    mistakes=(
        (_levels_wrong_bit, "level 0 is the query's own key and always holds it; level l >= 1 depends on bit l - 1 "
                            "of t, not bit l."),
        (_levels_by_size, "a bucket is not there because enough keys precede t: level l >= 1 exists exactly when "
                          "bit l - 1 of t is set (t = 4 has no level 1 or 2 bucket)."),
    ),
)

EXERCISES = (MICRO_BATCH_ROWS, LOSS_BY_POSITION, NONEMPTY_LEVELS)
