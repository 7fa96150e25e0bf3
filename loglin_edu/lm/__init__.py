"""Language modelling: training one model on a token stream (on one process or data-parallel with DDP) and
the measurements of a trained model (perplexity, loss by position, needle-in-a-haystack, learned λ).

The data it reads — corpus, tokenizer, token streams, needle prompts — lives in :mod:`loglin_edu.data`;
the experiment that runs the five models is :mod:`loglin_edu.experiments.lm`.
"""

from .evaluation import level_weights, needle_scores, per_position_loss, smooth_by_log_position, validation_loss
from .training import LMTrainConfig, train_lm

__all__ = [
    "LMTrainConfig",
    "level_weights",
    "needle_scores",
    "per_position_loss",
    "smooth_by_log_position",
    "train_lm",
    "validation_loss",
]
