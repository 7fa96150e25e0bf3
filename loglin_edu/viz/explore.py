"""Live explorations with ipywidgets (they need a running kernel; the static book uses :mod:`.animate`).

ipywidgets is imported when a function is called, so the package imports without it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from ..fenwick import num_levels
from ..masks import decay_mask, hierarchical_mask
from .figures import draw_buckets, draw_levels, draw_matrix

MAX_LEN = 64


def explorer_masks(seq_len: int, lambdas, log_decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``M^H`` with one λ per level (the same for every query) and ``M^S`` with a constant decay ``g``.

    lambdas: ``L >= num_levels(seq_len)`` values; log_decay: ``g <= 0``. Returns two ``[T, T]`` masks.
    """
    lam = torch.tensor(lambdas, dtype=torch.float64)[: num_levels(seq_len)]
    level_scales = lam.expand(1, seq_len, 1, len(lam))
    g = torch.full((1, seq_len, 1), float(log_decay), dtype=torch.float64)
    return hierarchical_mask(level_scales)[0, 0], decay_mask(g)[0, 0]


def draw_explorer(seq_len: int, query: int, chunk_size: int, lambdas, log_decay: float):
    """The explorer's figure: ``M^H``, ``M^S``, their product and the buckets of ``query``."""
    m_h, m_s = explorer_masks(seq_len, lambdas, log_decay)
    fig = plt.figure(figsize=(12, 5.2), layout="constrained")
    grid = fig.add_gridspec(2, 3, height_ratios=(4, 1))
    titles = ("hierarchical M^H (λ per level)", f"decay M^S (g = {log_decay:.2f})", "M = M^S ⊙ M^H")
    for col, (mask, title) in enumerate(zip((m_h, m_s, m_s * m_h), titles)):
        ax = draw_matrix(mask, fig.add_subplot(grid[0, col]), title=title, vmin=0)
        ax.axhline(query, color="red", lw=0.8)
        for edge in range(chunk_size, seq_len, chunk_size):
            ax.axhline(edge - 0.5, color="white", lw=0.5)
            ax.axvline(edge - 0.5, color="white", lw=0.5)
    draw_buckets(min(query, seq_len - 1), fig.add_subplot(grid[1, :]), seq_len=seq_len)
    return fig


def mask_explorer():
    """Sliders for sequence length, query position, chunk size, one λ per level and the decay; redraws the masks.

    Returns the widget (display it, or leave it as the last expression of a cell).
    """
    import ipywidgets as w
    from IPython.display import display

    seq_len = w.IntSlider(16, min=2, max=MAX_LEN, description="T")
    query = w.IntSlider(11, min=0, max=15, description="query t")
    chunk = w.Dropdown(options=[2, 4, 8, 16], value=4, description="chunk C")
    decay = w.FloatSlider(-0.05, min=-1.0, max=0.0, step=0.01, description="decay g")
    lambdas = [w.FloatSlider(1.0, min=0.0, max=2.0, step=0.05, description=f"λ level {lvl}")
               for lvl in range(num_levels(MAX_LEN))]
    w.dlink((seq_len, "value"), (query, "max"), lambda T: T - 1)
    out = w.Output()

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            fig = draw_explorer(seq_len.value, query.value, chunk.value, [s.value for s in lambdas], decay.value)
            display(fig)
            plt.close(fig)

    for control in (seq_len, query, chunk, decay, *lambdas):
        control.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([w.VBox([seq_len, query, chunk, decay]), w.VBox(lambdas)]), out])


def bucket_explorer():
    """Sliders for the sequence length and the query: the level table with that query's row, and its buckets."""
    import ipywidgets as w
    from IPython.display import display

    seq_len = w.IntSlider(16, min=2, max=MAX_LEN, description="T")
    query = w.IntSlider(13, min=0, max=15, description="query t")
    w.dlink((seq_len, "value"), (query, "max"), lambda T: T - 1)
    out = w.Output()

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 6.4), height_ratios=(4, 1), layout="constrained")
            draw_levels(seq_len.value, top, query=query.value)
            draw_buckets(query.value, bottom, seq_len=seq_len.value)
            display(fig)
            plt.close(fig)

    for control in (seq_len, query):
        control.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([seq_len, query]), out])
