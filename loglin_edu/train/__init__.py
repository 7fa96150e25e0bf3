"""Training shared by the experiments, one module per step of the job:

- :mod:`~loglin_edu.train.schedule` — AdamW groups, warm-up + cosine schedule;
- :mod:`~loglin_edu.train.checkpoint` — atomic checkpoints, a JSON-lines log kept consistent on resume;
- :mod:`~loglin_edu.train.ensemble` — many small models of one architecture run as one (``vmap``);
- :mod:`~loglin_edu.train.batches`, :mod:`~loglin_edu.train.evaluate` — recall batches and accuracy;
- :mod:`~loglin_edu.train.loop` — :func:`train`: build or resume, step, evaluate, checkpoint;
- :mod:`~loglin_edu.train.lm` — :func:`train_lm`: one language model on a token stream, on one process or
  data-parallel over ``torchrun`` ranks (:mod:`~loglin_edu.train.distributed`), and
  :mod:`~loglin_edu.train.lm_measures` — what a trained language model is measured by.
"""

from .batches import batch_rows, gather_batch
from .checkpoint import save_atomic
from .ensemble import Ensemble, Member
from .evaluate import evaluate
from .lm import LMTrainConfig, train_lm
from .loop import TrainConfig, train
from .schedule import lr_factor, make_optimizer

__all__ = [
    "Ensemble",
    "LMTrainConfig",
    "Member",
    "TrainConfig",
    "batch_rows",
    "evaluate",
    "gather_batch",
    "lr_factor",
    "make_optimizer",
    "save_atomic",
    "train",
    "train_lm",
]
