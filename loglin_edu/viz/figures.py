"""Static figures of the book: masks, level tables, buckets, the binary counter, H-matrix blocks, chunk stages,
decoding measurements.

Every function draws on a matplotlib ``Axes`` (a new figure when ``ax`` is None) and returns that ``Axes``.
Matrices are drawn with the key position ``s`` across and the query position ``t`` down, like ``M[t, s]``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from ..fenwick import buckets, level_matrix, num_levels
from ..state import FenwickState

# One colour per level, recent (small buckets) warm to old (large buckets) cool; reused by every figure.
LEVEL_COLORS = (
    "#d62728", "#ff7f0e", "#bcbd22", "#2ca02c", "#17becf", "#1f77b4", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
)


def _axes(ax, size=(4.5, 4.0)):
    if ax is None:
        _, ax = plt.subplots(figsize=size, layout="constrained")
    return ax


def label_positions(ax):
    """Integer ticks and the ``s`` across / ``t`` down labels of every ``M[t, s]`` picture."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("key position s")
    ax.set_ylabel("query position t")


def level_colormap(levels: int) -> tuple[ListedColormap, BoundaryNorm]:
    """A discrete colormap for levels ``0..levels-1`` (and its norm), shared by all level figures."""
    colors = [LEVEL_COLORS[i % len(LEVEL_COLORS)] for i in range(levels)]
    return ListedColormap(colors), BoundaryNorm(np.arange(-0.5, levels), levels)


def draw_matrix(
    matrix: torch.Tensor, ax=None, *, title: str | None = None, cmap: str = "viridis", colorbar: bool = True,
    vmin: float | None = None, vmax: float | None = None,
):
    """Draw a lower-triangular ``[T, T]`` matrix ``M[t, s]``; entries above the diagonal are left blank."""
    ax = _axes(ax)
    values = matrix.detach().double().cpu().numpy().copy()
    T = values.shape[0]
    values[np.triu_indices(T, 1)] = np.nan
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    if colorbar:
        ax.figure.colorbar(image, ax=ax, shrink=0.8)
    label_positions(ax)
    if title:
        ax.set_title(title)
    return ax


def draw_levels(seq_len: int, ax=None, *, query: int | None = None, numbers: bool | None = None, colorbar=True):
    """Draw ``level(t, s)`` for a length-``seq_len`` sequence, one colour per level.

    query: outline that query's row. numbers: write the level in each cell (default: when ``seq_len <= 16``).
    """
    ax = _axes(ax)
    levels = level_matrix(seq_len).double().numpy()
    levels[levels < 0] = np.nan
    cmap, norm = level_colormap(num_levels(seq_len))
    image = ax.imshow(levels, cmap=cmap, norm=norm, interpolation="nearest")
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, shrink=0.8, ticks=range(num_levels(seq_len)))
        bar.set_label("level(t, s)")
    if numbers if numbers is not None else seq_len <= 16:
        for t in range(seq_len):
            for s in range(t + 1):
                ax.text(s, t, int(levels[t, s]), ha="center", va="center", fontsize=7, color="white")
    if query is not None:
        ax.add_patch(Rectangle((-0.5, query - 0.5), seq_len, 1, fill=False, lw=2, ec="black"))
    label_positions(ax)
    ax.set_title(f"level(t, s), T = {seq_len}")
    return ax


def draw_buckets(t: int, ax=None, *, seq_len: int | None = None):
    """Draw the keys ``0..t`` of query ``t`` as one strip coloured by their Fenwick bucket (level).

    seq_len: width of the strip (default ``t + 1``), so frames of an animation share their axes.
    """
    ax = _axes(ax, size=(7, 1.6))
    width = t + 1 if seq_len is None else seq_len
    cmap, norm = level_colormap(num_levels(width))
    for lvl, keys in enumerate(buckets(t)):
        if len(keys):
            color = cmap(norm(lvl))
            ax.add_patch(Rectangle((keys.start - 0.5, 0), len(keys), 1, fc=color, ec="white", lw=1))
            share = len(keys) / width  # of the strip: a label is drawn only where it fits
            label = f"level {lvl}: {keys.start}..{keys.stop - 1}" if share >= 0.2 and len(keys) >= 4 else \
                f"ℓ={lvl}" if share >= 0.045 else ""
            ax.text((keys.start + keys.stop - 1) / 2, 0.5, label, ha="center", va="center", fontsize=8, color="white")
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("key position s")
    ax.set_title(f"buckets of query t = {t} = 0b{t:b}: {bin(t).count('1') + 1} non-empty")
    return ax


def counter_occupancy(steps: int) -> np.ndarray:
    """``[steps, L]`` table: how many keys each level of a :class:`~loglin_edu.FenwickState` holds after token t.

    Measured by running the package's decoding state with ``k = v = 1`` (K = V = 1) and no decay, so the
    state of a level *is* the number of keys in it; 0 marks an empty level.
    """
    state, one = FenwickState(), torch.ones(1, 1, 1, dtype=torch.float64)
    lam = torch.ones(1, 1, num_levels(steps), dtype=torch.float64)
    table = np.zeros((steps, num_levels(steps)), dtype=np.int64)
    for t in range(steps):
        state.step(one, one, one, lam)
        for lvl, s in enumerate(state.levels):
            if s is not None:
                table[t, lvl] = int(s.item())
    return table


def draw_binary_counter(steps: int, ax=None):
    """Draw :func:`counter_occupancy`: rows are tokens, columns levels, each cell the number of keys it holds."""
    occupancy = counter_occupancy(steps)
    ax = _axes(ax, size=(4.0, 0.25 * steps + 1))
    cmap, norm = level_colormap(occupancy.shape[1])
    for t in range(steps):
        for lvl in range(occupancy.shape[1]):
            if occupancy[t, lvl]:
                ax.add_patch(Rectangle((lvl - 0.5, t - 0.5), 1, 1, fc=cmap(norm(lvl)), ec="white"))
                ax.text(lvl, t, occupancy[t, lvl], ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(-0.5, occupancy.shape[1] - 0.5)
    ax.set_ylim(steps - 0.5, -0.5)
    ax.set_xticks(range(occupancy.shape[1]))
    ax.set_yticks(range(steps), [f"{t} = {t:0{max(1, (steps - 1).bit_length())}b}" for t in range(steps)], fontsize=7)
    ax.set_xlabel("level")
    ax.set_title("keys held per level (FenwickState)")
    return ax


@dataclass(frozen=True)
class Block:
    """One off-diagonal block of the hierarchical mask: every pair in it is at ``level`` (query rows, key cols)."""

    level: int
    rows: range
    cols: range


def fenwick_blocks(seq_len: int) -> list[Block]:
    """The H-matrix blocks of a length-``seq_len`` sequence: ``(t, s)`` with ``s < t`` lie in exactly one.

    At level ``l >= 1`` every aligned ``2**l`` block of positions splits into halves; queries of the upper
    half read the keys of the lower half at level ``l``. The blocks are truncated at ``seq_len``.
    """
    blocks = []
    for lvl in range(1, num_levels(seq_len)):
        half = 1 << (lvl - 1)
        for start in range(0, seq_len, 2 * half):
            rows = range(start + half, min(start + 2 * half, seq_len))
            if len(rows):
                blocks.append(Block(lvl, rows, range(start, start + half)))
    return blocks


def draw_blocks(seq_len: int, ax, *, min_size: int = 1, color: str = "black"):
    """Outline the :func:`fenwick_blocks` with at least ``min_size`` key columns on ``ax``."""
    for block in fenwick_blocks(seq_len):
        if len(block.cols) >= min_size:
            ax.add_patch(
                Rectangle((block.cols.start - 0.5, block.rows.start - 0.5), len(block.cols), len(block.rows),
                          fill=False, ec=color, lw=1.2)
            )
    return ax


def stage_table(seq_len: int, chunk_size: int) -> torch.Tensor:
    """``[T, T]`` int64: which stage of the chunk scan computes ``(t, s)``.

    ``0`` = intra-chunk (a dense ``C × C`` block); ``m >= 1`` = inter-chunk level ``m``, read from a state;
    ``-1`` above the diagonal. For pairs in different chunks ``level(t, s) = log2(C) + m``.
    """
    levels = level_matrix(seq_len)
    chunk = torch.arange(seq_len) // chunk_size
    same_chunk = chunk[:, None] == chunk[None, :]
    inter = levels - (chunk_size.bit_length() - 1)
    return torch.where(levels < 0, levels, torch.where(same_chunk, torch.zeros_like(levels), inter))


def draw_stages(seq_len: int, chunk_size: int, ax=None, *, upto: int | None = None, colorbar: bool = True):
    """Draw :func:`stage_table`: grey for the intra-chunk stage, one colour per inter-chunk level.

    upto: draw only the stages ``0..upto`` (the rest blank), for step-by-step pictures.
    """
    ax = _axes(ax)
    stages = stage_table(seq_len, chunk_size).double().numpy()
    n_stages = int(stages.max()) + 1
    if upto is not None:
        stages[stages > upto] = np.nan
    stages[stages < 0] = np.nan
    colors = ["#b0b0b0"] + [LEVEL_COLORS[(m + 2) % len(LEVEL_COLORS)] for m in range(1, n_stages)]
    cmap, norm = ListedColormap(colors), BoundaryNorm(np.arange(-0.5, n_stages), n_stages)
    image = ax.imshow(stages, cmap=cmap, norm=norm, interpolation="nearest")
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, shrink=0.8, ticks=range(n_stages))
        bar.set_ticklabels(["intra"] + [f"inter m={m}" for m in range(1, n_stages)])
    for edge in range(chunk_size, seq_len, chunk_size):
        ax.axhline(edge - 0.5, color="white", lw=0.6)
        ax.axvline(edge - 0.5, color="white", lw=0.6)
    label_positions(ax)
    ax.set_title(f"chunk-scan stage, T = {seq_len}, C = {chunk_size}")
    return ax


def draw_series(lengths, series: dict[str, list[float]], ax=None, *, ylabel: str, title: str | None = None):
    """Log-log lines of several measured quantities against the sequence length (memory, FLOPs, time)."""
    ax = _axes(ax, size=(5.5, 3.8))
    for (label, values), marker in zip(series.items(), itertools.cycle("os^vDx*")):
        ax.loglog(lengths, values, marker=marker, label=label)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


DECODE_LABELS = {
    "loglinear": "log-linear Mamba-2 (Triton step)",
    "loglinear_loop": "log-linear Mamba-2 (Triton step, eager decay, level loop)",
    "loglinear_unrolled": "log-linear Mamba-2 (Triton step, eager decay, levels unrolled)",
    "loglinear_lazy": "log-linear Mamba-2 (Triton step, lazy decay, level loop)",
    "loglinear_lazy_unrolled": "log-linear Mamba-2 (Triton step, lazy decay, levels unrolled)",
    "loglinear_split": "log-linear Mamba-2 (Triton step, eager decay, levels unrolled on key slices)",
    "loglinear_lazy_split": "log-linear Mamba-2 (Triton step, lazy decay, levels unrolled on key slices)",
    "loglinear_torch": "log-linear Mamba-2 (PyTorch step)",
    "mamba2": "Mamba-2",
    "attention": "softmax attention, KV cache",
}
"""The implementations of :mod:`loglin_edu.bench.decode` as the book names them."""


def draw_decode_results(result: dict, quantity: str, batch: int, ax=None, *, names=None, legend: bool = True):
    """One panel of a decode benchmark's results (:mod:`loglin_edu.bench.decode`): ``quantity`` (``"step_ms"``
    or ``"state_bytes"``) against the context for every implementation, at batch ``batch``; a row without the
    quantity (a skipped KV cache) leaves a gap. Series carry the names of :data:`DECODE_LABELS`; the legend
    goes below the axes (``legend=False``: none, for one legend shared by several panels)."""
    rows = [r for r in result["rows"] if r["batch"] == batch]
    contexts = sorted({r["context"] for r in rows})
    names = names or list(dict.fromkeys(r["name"] for r in rows))
    series = {}
    for name in names:
        by_context = {r["context"]: r.get(quantity) for r in rows if r["name"] == name}
        series[DECODE_LABELS.get(name, name)] = [np.nan if by_context.get(T) is None else by_context[T]
                                                 for T in contexts]
    label = {"step_ms": "ms per token (one layer's step)", "state_bytes": "bytes of decoding state"}[quantity]
    ax = draw_series(contexts, series, ax, ylabel=label, title=f"batch {batch}")
    ax.set_xlabel("context T (tokens)")
    ax.get_legend().remove()
    if legend:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False)
    return ax
