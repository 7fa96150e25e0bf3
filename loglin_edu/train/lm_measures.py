"""What a trained language model is measured by: the paper's three LM measurements, in shape.

- :func:`validation_loss`: mean next-token cross-entropy on held-out windows, and ``perplexity = exp(loss)``.
- :func:`per_position_loss`: the mean loss at each position ``t`` of a window,

      loss(t) = mean over windows w of  -log p(x_{w, t+1} | x_{w, 0..t})

  over windows longer than the training context too (2× shows how each model extrapolates).
- :func:`needle_scores`: needle-in-a-haystack accuracy (:mod:`loglin_edu.data.needles`), scored two ways.
  ``greedy``: the answer's digits are the model's argmax at every answer position, teacher-forced — exactly
  when greedy decoding writes the right number. ``choice``: the right number has the highest total
  log-probability among ``choices`` candidates (chance ``1 / choices``) — a graded signal for models too
  small to write seven digits right.
- :func:`level_weights`: the learned λ of each log-linear layer, averaged by head and Fenwick level over the
  positions where that level's bucket is non-empty (bucket ℓ ≥ 1 of query t exists iff bit ℓ−1 of t is set).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..data.needles import NeedlePrompt, needle_prompt
from ..data.token_stream import TokenStream, evaluation_starts
from ..layers import LevelScales
from . import distributed


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on CUDA when ``enabled`` (the attention operators themselves run in float32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")


def token_losses(model: nn.Module, tokens: torch.Tensor, amp: bool = False) -> torch.Tensor:
    """Next-token cross-entropy at every position. tokens: ``[B, T + 1]`` -> ``[B, T]`` (float32)."""
    with autocast(tokens.device, amp):
        logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().transpose(1, 2), tokens[:, 1:], reduction="none")


@torch.no_grad()
def loss_by_position(model: nn.Module, stream: TokenStream, length: int, num_windows: int, batch_size: int, *,
                     amp: bool = False) -> tuple[torch.Tensor, int]:
    """Summed loss at each position over the evaluation windows of this rank (windows ``rank::world``),
    added over the ranks. Returns ``([length], windows counted)``."""
    world = distributed.current()
    device = next(model.parameters()).device
    starts = evaluation_starts(stream, length + 1, num_windows)
    mine = starts[world.rank:: world.size]
    total = torch.zeros(length, dtype=torch.float64, device=device)
    for i in range(0, len(mine), batch_size):
        tokens = stream.windows(mine[i: i + batch_size], length + 1).to(device)
        total += token_losses(model, tokens, amp).double().sum(0)
    return distributed.all_sum(total), len(starts)


def validation_loss(model: nn.Module, stream: TokenStream, context: int, num_windows: int, batch_size: int, *,
                    amp: bool = False) -> dict:
    """Mean loss over ``num_windows`` fixed windows of ``context`` tokens (module docstring); on several ranks
    each evaluates its share. Returns ``dict(loss, perplexity, tokens)``."""
    was_training = model.training
    model.eval()
    total, count = loss_by_position(model, stream, context, num_windows, batch_size, amp=amp)
    model.train(was_training)
    loss = (total.sum() / (count * context)).item()
    return dict(loss=loss, perplexity=math.exp(min(loss, 50.0)), tokens=count * context)


def per_position_loss(model: nn.Module, stream: TokenStream, length: int, num_windows: int, batch_size: int, *,
                      amp: bool = False) -> torch.Tensor:
    """``[length]``: mean loss at each position (module docstring), float64 on the CPU."""
    was_training = model.training
    model.eval()
    total, count = loss_by_position(model, stream, length, num_windows, batch_size, amp=amp)
    model.train(was_training)
    return (total / count).cpu()


def smooth_by_log_position(losses: torch.Tensor, bins_per_octave: int = 4) -> tuple[list[float], list[float]]:
    """Per-position losses averaged over bins of geometrically growing width (for a log-x plot): returns the
    bins' mean positions and mean losses."""
    T = len(losses)
    steps = range(int(bins_per_octave * math.log2(T)) + 2)
    edges = sorted({0, T} | {min(T, round(2 ** (k / bins_per_octave))) for k in steps})
    centers, means = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi > lo:
            centers.append((lo + hi - 1) / 2)
            means.append(losses[lo:hi].mean().item())
    return centers, means


@torch.no_grad()
def score_prompt(model: nn.Module, prompt: NeedlePrompt, amp: bool = False) -> dict:
    """Greedy and choice correctness of one needle prompt (module docstring)."""
    device = next(model.parameters()).device
    rows = [prompt.tokens + c for c in prompt.candidates]
    width = max(len(r) for r in rows)
    batch = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)
    with autocast(device, amp):
        logits = model(batch[:, :-1])
    logp = logits.float().log_softmax(-1)
    n = len(prompt.tokens)
    scores, greedy = [], None
    for i, cand in enumerate(prompt.candidates):
        positions = torch.arange(n - 1, n - 1 + len(cand), device=device)
        target = torch.tensor(cand, device=device)
        scores.append(logp[i, positions, target].sum().item())
        if i == 0:
            greedy = bool((logp[0, positions].argmax(-1) == target).all())
    return dict(greedy=greedy, choice=scores[0] > max(scores[1:], default=-math.inf), log_probs=scores)


def needle_scores(model: nn.Module, tokenizer, stream: TokenStream, *, lengths: Sequence[int], depths: Sequence[float],
                  num_keys: int = 1, samples: int = 4, choices: int = 10, seed: int = 0, amp: bool = False) -> dict:
    """Accuracy on a grid of prompt lengths × needle depths, ``samples`` prompts per cell (module docstring).

    Returns ``dict(lengths, depths, num_keys, samples, choices, chance, greedy, choice)``; ``greedy`` and
    ``choice`` are ``[len(lengths)][len(depths)]`` fractions of correct prompts.
    """
    was_training = model.training
    model.eval()
    greedy = [[0.0] * len(depths) for _ in lengths]
    choice = [[0.0] * len(depths) for _ in lengths]
    for i, length in enumerate(lengths):
        for j, depth in enumerate(depths):
            for s in range(samples):
                prompt = needle_prompt(tokenizer, stream, length=length, depth=depth, num_keys=num_keys,
                                       choices=choices, seed=seed * 1_000_003 + i * 10_007 + j * 101 + s)
                result = score_prompt(model, prompt, amp)
                greedy[i][j] += result["greedy"] / samples
                choice[i][j] += result["choice"] / samples
    model.train(was_training)
    return dict(lengths=list(lengths), depths=list(depths), num_keys=num_keys, samples=samples, choices=choices,
                chance=1 / choices, greedy=greedy, choice=choice)


def nonempty_levels(seq_len: int, levels: int) -> torch.Tensor:
    """``[T, L]`` bool: whether bucket ``ℓ`` of query ``t`` holds any key (ℓ = 0 always; ℓ ≥ 1 iff bit ℓ−1
    of t is set)."""
    t = torch.arange(seq_len)[:, None]
    lvl = torch.arange(levels)[None, :]
    return (lvl == 0) | ((t >> (lvl - 1).clamp(min=0)) & 1).bool() & (lvl >= 1)


@torch.no_grad()
def level_weights(model: nn.Module, tokens: torch.Tensor, amp: bool = False) -> list[list[list[float]]]:
    """λ of every log-linear layer: ``[layers][H][L]``, mean of ``level_scales[b, t, h, ℓ]`` over the batch and
    the positions whose bucket ℓ is non-empty (NaN for a level no position of ``tokens`` reaches).
    tokens: ``[B, T]``. Empty for a model without log-linear layers."""
    captured: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda mod, args, out: captured.append(out.float()))
             for m in model.modules() if isinstance(m, LevelScales)]
    was_training = model.training
    model.eval()
    try:
        with autocast(tokens.device, amp):
            model(tokens)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    result = []
    for lam in captured:  # [B, T, H, L]
        mask = nonempty_levels(lam.shape[1], lam.shape[3]).to(lam.device)[None, :, None, :]
        total = (lam * mask).sum((0, 1))
        count = mask.sum((0, 1)) * lam.shape[0]
        result.append(torch.where(count > 0, total / count.clamp(min=1), torch.nan).cpu().tolist())
    return result

