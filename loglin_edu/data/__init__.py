"""Synthetic recall tasks: MQAR (Zoology's multi-query associative recall) and lagged recall.

Each generator returns a :class:`RecallSet`: inputs, labels (-100 except at queries), and the positions
of every query and of the token that holds its answer, so a chapter can place answers in Fenwick buckets.
"""

from .lagged import lagged_recall
from .multiquery import mqar
from .recall import IGNORE_INDEX, RecallSet, drop_repeats

__all__ = ["IGNORE_INDEX", "RecallSet", "drop_repeats", "lagged_recall", "mqar"]
