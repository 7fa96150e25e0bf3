"""A small language model shared by every experiment: embedding, pre-norm blocks, head.

    h_0 = E[tokens];   h_{i+1} = h_i + mixer_i(RMSNorm(h_i))  [+ MLP_i(RMSNorm(·)) when mlp=True]
    logits = RMSNorm(h_n) Eᵀ          (the head shares the embedding matrix unless tie_embeddings=False)

The sequence mixer is one of :data:`MIXERS`, chosen by name in a :class:`ModelConfig`. With ``hybrid_conv = w``
the even layers (0, 2, …) are a :class:`~loglin_edu.layers.gated_conv.GatedConvolution` of width ``w`` instead,
the odd ones the mixer: Zoology's hybrid of a gated short convolution and attention.

Decoding (:mod:`loglin_edu.layers.generation`): ``prefill(tokens)`` returns the logits and a cache,
``step(token, cache)`` the next logits, ``generate(prompt, max_new_tokens, ...)`` the continued tokens.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .attention import SoftmaxAttention
from .cache import MixerCache
from .gated_conv import GatedConvolution
from .gated_deltanet import GatedDeltaNet, LogLinearGatedDeltaNet
from .generation import ModelCache, check_generation, sample_next
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
MODEL_IDENTITIES = itertools.count()  # every LanguageModel gets its own number: a cache names its maker


@dataclass
class ModelConfig:
    """What :func:`build_model` builds. mixer: a key of :data:`MIXERS`; max_len: the longest sequence
    (it fixes the number of Fenwick levels of the log-linear mixers); mixer_options: keyword arguments of
    the mixer class (``d_state``, ``num_heads``, ``backend``, ``form``, ...); hybrid_conv: the width of a
    :class:`~loglin_edu.layers.gated_conv.GatedConvolution` in place of the mixer in the even layers (0: none)."""

    mixer: str
    vocab_size: int
    d_model: int
    n_layers: int = 2
    max_len: int = 2048
    mlp: bool = False
    mlp_ratio: int = 4
    tie_embeddings: bool = True
    mixer_options: dict[str, Any] = field(default_factory=dict)
    hybrid_conv: int = 0

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

    def prefill(self, h: torch.Tensor, max_len: int) -> tuple[torch.Tensor, MixerCache]:
        """:meth:`forward` of ``h: [B, T, d_model]`` and the mixer's cache after it."""
        mixed, cache = self.mixer.prefill(self.mixer_norm(h), max_len)
        h = h + mixed
        return (h if self.mlp is None else h + self.mlp(self.mlp_norm(h))), cache

    def step(self, h_t: torch.Tensor, cache: MixerCache) -> torch.Tensor:
        """One token: ``h_t: [B, d_model]`` -> ``[B, d_model]`` (the MLP and norms act per token)."""
        h_t = h_t + self.mixer.step(self.mixer_norm(h_t), cache)
        return h_t if self.mlp is None else h_t + self.mlp(self.mlp_norm(h_t))


def make_mixer(config: ModelConfig) -> nn.Module:
    """One sequence mixer of ``config`` (the log-linear ones get ``max_len``)."""
    if config.mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {tuple(MIXERS)}, got {config.mixer!r}")
    options = dict(config.mixer_options)
    if config.mixer in LOGLINEAR_MIXERS:
        options["max_len"] = config.max_len
    return MIXERS[config.mixer](config.d_model, **options)


def layer_mixer(config: ModelConfig, index: int) -> nn.Module:
    """The sequence mixer of layer ``index``: a gated convolution in the even layers when ``config.hybrid_conv``,
    else :func:`make_mixer`."""
    width = config.hybrid_conv
    if not isinstance(width, int) or isinstance(width, bool) or width < 0:
        raise ValueError(f"hybrid_conv must be an integer >= 0 (0: no convolution layers), got {width!r}")
    return GatedConvolution(config.d_model, width) if width and index % 2 == 0 else make_mixer(config)


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
            Block(layer_mixer(config, i), config.d_model, MLP(config.d_model, config.mlp_ratio) if config.mlp else None)
            for i in range(config.n_layers)
        )
        self.norm = RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(_init_weights)
        if config.tie_embeddings:
            self.head.weight = self.embedding.weight
        self.cache_owner = next(MODEL_IDENTITIES)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.shape[1] > self.config.max_len:
            raise ValueError(f"tokens have length T={tokens.shape[1]} > the model's max_len={self.config.max_len}")
        h = self.embedding(tokens)
        for block in self.blocks:
            h = block(h)
        if positions is not None:
            h = h.flatten(0, 1)[positions]
        return self.head(self.norm(h))

    def init_cache(self, batch: int, max_len: int | None = None) -> ModelCache:
        """The cache before the first token, for ``batch`` sequences of at most ``max_len`` tokens (the
        model's ``max_len`` when None)."""
        max_len = self.cache_length(max_len)
        layers = [block.mixer.init_cache(batch, max_len) for block in self.blocks]
        return ModelCache(self.cache_owner, self.config.to_dict(), batch, max_len, layers=layers)

    def cache_length(self, max_len: int | None) -> int:
        """``max_len`` of a new cache: at most the model's ``max_len``."""
        if max_len is None:
            return self.config.max_len
        if max_len > self.config.max_len:
            raise ValueError(f"max_len={max_len} is more than the model's max_len={self.config.max_len}")
        return max_len

    def prefill(self, tokens: torch.Tensor, max_len: int | None = None) -> tuple[torch.Tensor, ModelCache]:
        """Run a prompt ``tokens: [B, T]`` once: its logits ``[B, T, vocab]`` (those of :meth:`forward`) and
        the cache to decode on with, room for ``max_len`` tokens in all (the model's when None)."""
        max_len = self.cache_length(max_len)
        if tokens.dim() != 2 or tokens.shape[1] > max_len:
            raise ValueError(f"tokens must have shape [B, T] with 1 <= T <= max_len={max_len}, got {tuple(tokens.shape)}")
        h, layers = self.embedding(tokens), []
        for block in self.blocks:
            h, cache = block.prefill(h, max_len)
            layers.append(cache)
        cache = ModelCache(self.cache_owner, self.config.to_dict(), tokens.shape[0], max_len, tokens.shape[1], layers)
        return self.head(self.norm(h)), cache

    def step(self, token: torch.Tensor, cache: ModelCache) -> torch.Tensor:
        """Feed one token per sequence, ``token: [B]`` int: the next logits ``[B, vocab]``; advances ``cache``."""
        self.check_cache(cache, token)
        h = self.embedding(token)
        for block, layer_cache in zip(self.blocks, cache.layers):
            h = block.step(h, layer_cache)
        cache.position += 1
        return self.head(self.norm(h))

    def check_cache(self, cache: ModelCache, token: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``cache`` was made by this model, holds ``token``'s batch and has room."""
        if not isinstance(cache, ModelCache):
            raise ValueError(f"cache must be a ModelCache from this model's prefill or init_cache, got {type(cache).__name__}")
        if cache.owner != self.cache_owner:
            mine = self.config.to_dict()
            differ = {key: (cache.config.get(key), mine[key]) for key in mine if cache.config.get(key) != mine[key]}
            what = f"its configuration differs (cache, model): {differ}" if differ else "same configuration, other weights"
            raise ValueError(f"this cache was made by another model: {what}")
        if token.dim() != 1 or token.shape[0] != cache.batch:
            raise ValueError(f"token must have shape [B={cache.batch}] (the cache's batch), got {tuple(token.shape)}")
        if cache.position >= cache.max_len:
            raise ValueError(f"decoding past max_len={cache.max_len}: the cache already holds {cache.position} tokens")

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
        progress: bool = False,
    ) -> torch.Tensor:
        """Continue ``prompt`` (``[B, T]`` or ``[T]`` int) by ``max_new_tokens`` tokens: prefill once, then one
        cached step per token (:mod:`loglin_edu.layers.generation`). temperature: 0 is greedy (argmax);
        top_k: sample among the k largest logits; seed: the sampling generator's seed; progress: a tqdm bar.
        Returns the prompt and the new tokens, ``[B, T + max_new_tokens]`` (or ``[T + max_new_tokens]``).
        """
        single = isinstance(prompt, torch.Tensor) and prompt.dim() == 1
        tokens = prompt[None] if single else prompt
        check_generation(tokens, max_new_tokens, temperature, top_k, self.config.max_len)
        if max_new_tokens == 0:
            return prompt.clone()
        generator = torch.Generator(device=tokens.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        logits, cache = self.prefill(tokens, max_len=tokens.shape[1] + max_new_tokens - 1)
        new = [sample_next(logits[:, -1], temperature, top_k, generator)]
        steps = range(max_new_tokens - 1)
        if progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc="generate", initial=1, total=max_new_tokens)
        for _ in steps:
            new.append(sample_next(self.step(new[-1], cache), temperature, top_k, generator))
        out = torch.cat([tokens, torch.stack(new, dim=1)], dim=1)
        return out[0] if single else out


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
