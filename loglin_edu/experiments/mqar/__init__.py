"""Associative-recall experiments: five architectures trained through one code path.

    python -m loglin_edu.experiments.mqar --tier cpu                       # minutes on a laptop CPU
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --out DIR # the paper's setting, one GPU
    python -m loglin_edu.experiments.mqar --tier gpu --task lagged --out DIR

A *job* is one architecture at one width: an :class:`~loglin_edu.train.Ensemble` of every (seed, learning
rate) pair, trained together. The ``gpu`` tier runs its jobs as parallel worker processes on the one GPU
(each job is far too small to keep it busy) and writes one JSON file with every evaluation, the final
accuracies, parameter counts, the command, commit, device, library versions and date.

Tiers (:data:`TIERS`):

- ``cpu``: MQAR at T = 32 with 2 and 4 pairs, a 64-token vocabulary, width 32, one seed, 400 steps — small
  enough for the book build and CI (about a minute on two idle cores), large enough to show the learning
  curves of all five models.
- ``gpu``/``mqar``: Zoology's protocol as the paper uses it: T = 256, 4–64 pairs (one training set per
  pair count, batches drawn evenly from them), vocabulary 8192, 2 layers, widths 16/32/64.
- ``gpu``/``lagged``: lagged recall (:mod:`loglin_edu.data.lagged`) at T = 256: answers at every distance.
"""

from .jobs import assemble, merge, run_job, run_piece, run_tier
from .report import (
    best_by_cell,
    cell_accuracies,
    cell_summary,
    claims,
    compare,
    results_record,
    summary_table,
    transformer_gate,
    verdict,
    verdicts,
)
from .settings import (
    LABELS,
    MODELS,
    PAPER_MQAR,
    PAPER_MQAR_AT_LEAST,
    TIERS,
    ZOOLOGY_LRS,
    TaskSpec,
    Tier,
    base_model,
    make_sets,
    mixer_options,
    model_config,
    state_size,
)

__all__ = [
    "LABELS", "MODELS", "PAPER_MQAR", "PAPER_MQAR_AT_LEAST", "TIERS", "ZOOLOGY_LRS", "TaskSpec", "Tier", "assemble",
    "merge", "run_piece",
    "base_model", "best_by_cell", "cell_accuracies", "cell_summary", "claims", "compare", "make_sets", "mixer_options",
    "model_config", "results_record", "run_job", "run_tier", "state_size", "summary_table",
    "transformer_gate", "verdict", "verdicts",
]
