"""Layers and models: the five sequence mixers of the book as ``nn.Module``s, and a small LM around them.

- :class:`SoftmaxAttention` (causal, RoPE), :class:`Mamba2`, :class:`LogLinearMamba2`,
  :class:`GatedDeltaNet`, :class:`LogLinearGatedDeltaNet`: ``[B, T, d_model] -> [B, T, d_model]``.
- :class:`GatedConvolution`: Zoology's gated short convolution, the even layers of a hybrid model
  (``ModelConfig(hybrid_conv=w)``).
- :class:`LanguageModel` with a :class:`ModelConfig`; :func:`build_model`, :func:`count_parameters`.
- Decoding: every mixer has ``init_cache``, ``prefill`` and ``step`` (a :class:`MixerCache`); the model
  has ``prefill``, ``step`` and ``generate`` (a :class:`ModelCache`).

Every mixer calls the package's operators through :func:`loglin_edu.ops.mix`; ``backend`` picks the
PyTorch forms or the Triton kernel (:func:`loglin_edu.ops.resolve_backend`).
"""

from .attention import SoftmaxAttention
from .cache import MixerCache
from .gated_conv import GatedConvolution
from .gated_deltanet import GatedDeltaNet, LogLinearGatedDeltaNet
from .generation import ModelCache, sample_next
from .mamba2 import LogLinearMamba2, Mamba2
from .model import LOGLINEAR_MIXERS, MIXERS, LanguageModel, ModelConfig, build_model, count_parameters
from .parts import GatedRMSNorm, LevelScales, RMSNorm, ShortConvolution, rotary

__all__ = [
    "GatedConvolution",
    "GatedDeltaNet",
    "GatedRMSNorm",
    "LOGLINEAR_MIXERS",
    "LanguageModel",
    "LevelScales",
    "LogLinearGatedDeltaNet",
    "LogLinearMamba2",
    "MIXERS",
    "Mamba2",
    "MixerCache",
    "ModelCache",
    "ModelConfig",
    "RMSNorm",
    "ShortConvolution",
    "SoftmaxAttention",
    "build_model",
    "count_parameters",
    "rotary",
    "sample_next",
]
