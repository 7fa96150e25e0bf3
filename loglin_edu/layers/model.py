"""A small language model shared by every experiment: embedding, pre-norm blocks, head.

    h_0 = E[tokens];   h_{i+1} = h_i + mixer_i(RMSNorm(h_i))  [+ MLP_i(RMSNorm(·)) when mlp=True]
    logits = RMSNorm(h_n) Eᵀ          (the head shares the embedding matrix unless tie_embeddings=False)

The sequence mixer is one of :data:`MIXERS`, chosen by name in a :class:`ModelConfig`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .attention import SoftmaxAttention
from .gated_deltanet import GatedDeltaNet, LogLinearGatedDeltaNet
from .mamba2 import LogLinearMamba2, Mamba2
from .parts import RMSNorm

MIXERS: dict[str, type[nn.Module]] = {
    "transformer": SoftmaxAttention,
    "mamba2": Mamba2,
    "loglinear_mamba2": LogLinearMamba2,
    "gated_deltanet": GatedDeltaNet,
    "loglinear_gated_deltanet": LogLinearGatedDeltaNet,
}
LOGLINEAR_MIXERS = ("loglinear_mamba2", "loglinear_gated_deltanet")


@dataclass
class ModelConfig:
    """What :func:`build_model` builds. mixer: a key of :data:`MIXERS`; max_len: the longest sequence
    (it fixes the number of Fenwick levels of the log-linear mixers); mixer_options: keyword arguments of
    the mixer class (``d_state``, ``num_heads``, ``backend``, ``form``, ...)."""

    mixer: str
    vocab_size: int
    d_model: int
    n_layers: int = 2
    max_len: int = 2048
    mlp: bool = False
    mlp_ratio: int = 4
    tie_embeddings: bool = True
    mixer_options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MLP(nn.Module):
    """``y = W_2 GELU(W_1 x)``, hidden width ``ratio · d_model``. ``[B, T, D] -> [B, T, D]``."""

    def __init__(self, d_model: int, ratio: int = 4) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, ratio * d_model, bias=False)
        self.down = nn.Linear(ratio * d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm residual block: ``h + mixer(norm(h))``, then ``+ mlp(norm(h))`` if it has an MLP."""

    def __init__(self, mixer: nn.Module, d_model: int, mlp: MLP | None) -> None:
        super().__init__()
        self.mixer_norm, self.mixer = RMSNorm(d_model), mixer
        self.mlp_norm = RMSNorm(d_model) if mlp is not None else None
        self.mlp = mlp

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.mixer(self.mixer_norm(h))
        return h if self.mlp is None else h + self.mlp(self.mlp_norm(h))


def make_mixer(config: ModelConfig) -> nn.Module:
    """One sequence mixer of ``config`` (the log-linear ones get ``max_len``)."""
    if config.mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {tuple(MIXERS)}, got {config.mixer!r}")
    options = dict(config.mixer_options)
    if config.mixer in LOGLINEAR_MIXERS:
        options["max_len"] = config.max_len
    return MIXERS[config.mixer](config.d_model, **options)


class LanguageModel(nn.Module):
    """Embedding, ``n_layers`` blocks, final norm and head (module docstring).

    tokens: ``[B, T]`` int. ``forward(tokens)`` returns logits ``[B, T, vocab]``; with
    ``positions: [N]`` (flat indices into ``B · T``) only those rows: ``[N, vocab]`` — a recall task
    supervises few positions, and the head is the largest product of a small model.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            Block(make_mixer(config), config.d_model, MLP(config.d_model, config.mlp_ratio) if config.mlp else None)
            for _ in range(config.n_layers)
        )
        self.norm = RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(_init_weights)
        if config.tie_embeddings:
            self.head.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.shape[1] > self.config.max_len:
            raise ValueError(f"tokens have length T={tokens.shape[1]} > the model's max_len={self.config.max_len}")
        h = self.embedding(tokens)
        for block in self.blocks:
            h = block(h)
        if positions is not None:
            h = h.flatten(0, 1)[positions]
        return self.head(self.norm(h))


def _init_weights(module: nn.Module) -> None:
    """Linear and embedding weights ~ N(0, 0.02²); the mixers' own parameters keep their initialisation."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def build_model(config: ModelConfig, seed: int | None = None) -> LanguageModel:
    """A :class:`LanguageModel`; with ``seed`` its initial weights depend on nothing else."""
    if seed is None:
        return LanguageModel(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LanguageModel(config)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameters of ``model``: ``total`` (tied weights once), ``embedding`` and ``non_embedding``."""
    total = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for p in model.embedding.parameters()) if hasattr(model, "embedding") else 0
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}
