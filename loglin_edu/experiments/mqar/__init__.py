"""Associative-recall experiments: five architectures (and two ablations) trained through one code path.

    python -m loglin_edu.experiments.mqar --tier cpu                                  # under a minute on a CPU
    python -m loglin_edu.experiments.mqar.step_time --out step_time.json               # ms per step, eager vs captured
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --budget-s 540 --out runs/recall   # one piece
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --merge --out runs/recall --results book/results

A *job* is one architecture at one width: an :class:`~loglin_edu.train.Ensemble` of every (seed, learning
rate) pair, trained together. The ``gpu`` tiers run their jobs as worker processes sharing one GPU, each writing
its own results file (:mod:`~loglin_edu.experiments.mqar.jobs`); ``--merge`` writes one file with every job's
evaluations, the learning rates chosen on the validation sets, the Transformer gate and a verdict per claim
(:mod:`~loglin_edu.experiments.mqar.report`), with the command, commit, device, library versions and date.

Tiers (:data:`TIERS`):

- ``cpu``: MQAR at T = 16 with 2 and 4 pairs, a 32-token vocabulary, width 32, one seed, 200 steps — small
  enough for the book build and CI, large enough to show the Transformer solve it and the others start.
- ``gpu/mqar``: Zoology's protocol as the paper uses it: T = 256, 4–64 pairs (one training set per pair count,
  batches drawn evenly from them), vocabulary 8192, 2 layers, widths 16/32/64, 3 seeds, Zoology's four
  learning rates, and both log-linear models with λ tied across levels (the ablation).
- ``gpu/lagged``: lagged recall (:mod:`loglin_edu.data.lagged`) at T = 256: answers at every distance.
"""

from .jobs import assemble, merge, run_job, run_piece, run_tier
from .report import (
    CONTRADICTED,
    NOT_AT_SCALE,
    SAME,
    best_by_cell,
    cell_accuracies,
    cell_summary,
    claims,
    compare,
    level_scales_by_level,
    results_record,
    summary_table,
    training_scale,
    transformer_gate,
    validation_curve,
    verdict,
    verdicts,
)
from .settings import (
    ABLATION,
    LABELS,
    MODELS,
    PAPER_MQAR,
    PAPER_MQAR_AT_LEAST,
    TIERS,
    ZOOLOGY_LRS,
    ZOOLOGY_SEQUENCES,
    TaskSpec,
    Tier,
    base_model,
    describe_transformer,
    make_sets,
    mixer_options,
    model_config,
    state_size,
    transformer_layout,
)

__all__ = [
    "CONTRADICTED", "NOT_AT_SCALE", "SAME",
    "ABLATION", "LABELS", "MODELS", "PAPER_MQAR", "PAPER_MQAR_AT_LEAST", "TIERS", "ZOOLOGY_LRS", "ZOOLOGY_SEQUENCES",
    "TaskSpec", "Tier", "assemble", "merge", "run_piece", "level_scales_by_level", "training_scale", "validation_curve",
    "base_model", "best_by_cell", "describe_transformer", "cell_accuracies", "cell_summary", "claims", "compare", "make_sets", "mixer_options",
    "model_config", "results_record", "run_job", "run_tier", "state_size", "summary_table",
    "transformer_gate", "transformer_layout", "verdict", "verdicts",
]
