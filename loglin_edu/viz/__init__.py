"""Figures, precomputed-frame animations and live widgets of the book (needs matplotlib; widgets need ipywidgets).

``figures``: static pictures (masks, level tables, buckets, binary counter, H-matrix blocks, chunk-scan stages);
``animate``: the same explorations as HTML players that work without a kernel; ``browser``: explorers whose
JavaScript computes the levels and masks in the page, live on the static website; ``explore``: ipywidgets controls
for a live notebook; ``measure``: counted FLOPs and robust times; ``notation``: the book's MathJax macros.
"""

from . import browser
from .animate import buffer_occupancy, counter_animation, level_animation, query_animation, stage_animation, to_html
from .explore import bucket_explorer, mask_explorer
from .figures import (
    DECODE_LABELS,
    Block,
    counter_occupancy,
    draw_binary_counter,
    draw_blocks,
    draw_buckets,
    draw_decode_results,
    draw_levels,
    draw_matrix,
    draw_series,
    draw_stages,
    fenwick_blocks,
    level_colormap,
    stage_table,
)
from .measure import best_median_seconds, matmul_flops, median_seconds
from .notation import MACROS, define_macros, source

__all__ = [
    "DECODE_LABELS",
    "MACROS",
    "Block",
    "best_median_seconds",
    "browser",
    "bucket_explorer",
    "buffer_occupancy",
    "counter_animation",
    "counter_occupancy",
    "define_macros",
    "draw_binary_counter",
    "draw_blocks",
    "draw_buckets",
    "draw_decode_results",
    "draw_levels",
    "draw_matrix",
    "draw_series",
    "draw_stages",
    "fenwick_blocks",
    "level_animation",
    "level_colormap",
    "mask_explorer",
    "matmul_flops",
    "median_seconds",
    "query_animation",
    "stage_animation",
    "source",
    "stage_table",
    "to_html",
]
