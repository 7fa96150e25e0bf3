"""Experiments: command-line programs with a small CPU tier (book build, CI) and GPU tiers whose outputs are
committed to ``book/results/``. ``python -m loglin_edu.experiments.mqar --help``."""
