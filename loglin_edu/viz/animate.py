"""Precomputed-frame animations: explorations that work on a static web page, without a kernel.

Each function returns a ``matplotlib.animation.FuncAnimation``; :func:`to_html` turns it into a self-contained
HTML player (every frame embedded as an image, a slider to move through them).
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.animation import FuncAnimation
from matplotlib.patches import Rectangle

import torch

from ..decoding import FenwickCache
from ..fenwick import level_matrix, num_levels
from .figures import label_positions, draw_blocks, draw_buckets, draw_levels, draw_stages, level_colormap, stage_table


def query_animation(seq_len: int) -> FuncAnimation:
    """One frame per query ``t = 0..seq_len-1``: its row of the level table and its buckets."""
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(6, 6.4), height_ratios=(4, 1), layout="constrained"
    )

    def frame(t):
        top.clear()
        bottom.clear()
        draw_levels(seq_len, top, query=t, colorbar=False)
        draw_buckets(t, bottom, seq_len=seq_len)

    return FuncAnimation(fig, frame, frames=range(seq_len), interval=400)


def level_animation(seq_len: int) -> FuncAnimation:
    """One frame per level ``l``: the pairs ``(t, s)`` with ``level(t, s) = l`` and the H-matrix blocks they fill."""
    fig, ax = plt.subplots(figsize=(5, 5), layout="constrained")
    levels = level_matrix(seq_len).numpy()
    cmap, norm = level_colormap(num_levels(seq_len))

    def frame(lvl):
        ax.clear()
        shown = np.where(levels == lvl, lvl, np.nan).astype(float)
        ax.imshow(shown, cmap=cmap, norm=norm, interpolation="nearest")
        ax.add_patch(Rectangle((-0.5, -0.5), seq_len, seq_len, fill=False, ec="0.7"))
        if lvl > 0:
            draw_blocks(seq_len, ax, min_size=1 << (lvl - 1))
        count = int((levels == lvl).sum())
        ax.set_title(f"level {lvl}: {count} pairs (t, s)")
        label_positions(ax)

    return FuncAnimation(fig, frame, frames=range(num_levels(seq_len)), interval=800)


def stage_animation(seq_len: int, chunk_size: int) -> FuncAnimation:
    """The chunk scan step by step: frame 0 the intra-chunk stage, frame ``m`` adds inter-chunk level ``m``."""
    fig, ax = plt.subplots(figsize=(5.5, 5), layout="constrained")
    n_stages = int(stage_table(seq_len, chunk_size).max()) + 1

    def frame(upto):
        ax.clear()
        draw_stages(seq_len, chunk_size, ax, upto=upto, colorbar=False)
        what = "intra-chunk blocks" if upto == 0 else f"after inter-chunk level {upto}"
        ax.set_title(f"T = {seq_len}, C = {chunk_size}: {what}")

    return FuncAnimation(fig, frame, frames=range(n_stages), interval=1000)


def buffer_occupancy(steps: int) -> np.ndarray:
    """``[steps + 1, L]``: keys held by each slot of a :class:`~loglin_edu.decoding.FenwickCache` (slot ``i``:
    level ``i + 1``) after ``t = 0..steps`` tokens, measured by stepping it with ``k = v = 1`` (K = V = 1) and no
    decay. The buffer has room for one token more than ``steps``, so the state after the last one fits."""
    cache = FenwickCache.empty(1, 1, 1, 1, max_len=steps + 1, dtype=torch.float64)
    one, lam = torch.ones(1, 1, 1, dtype=torch.float64), torch.ones(1, 1, cache.num_levels, dtype=torch.float64)
    table = [cache.levels[0, 0, :, 0, 0].clone()]
    for _ in range(steps):
        cache.step(one, one, one, lam)
        table.append(cache.levels[0, 0, :, 0, 0].clone())
    return torch.stack(table).round().long().numpy()


def counter_animation(steps: int) -> FuncAnimation:
    """One frame per token count ``t = 1..steps``: the decoding buffer's levels ``1..L`` as bars of the keys they
    hold (empty levels pale), and what the last token's carry merged."""
    occupancy = buffer_occupancy(steps)
    L = occupancy.shape[1]
    cmap, norm = level_colormap(L + 1)
    fig, ax = plt.subplots(figsize=(6.5, 3.2), layout="constrained")

    def frame(t):
        ax.clear()
        keys = occupancy[t]
        levels = range(1, L + 1)  # slot i holds level i + 1
        colors = [cmap(norm(lvl)) if keys[lvl - 1] else "0.9" for lvl in levels]
        ax.bar(levels, np.maximum(keys, 0.08), color=colors, edgecolor="0.4")
        for lvl in levels:
            held = keys[lvl - 1]
            ax.text(lvl, max(held, 1) * 1.15, str(held) if held else "empty", ha="center", fontsize=8)
        j = (t & -t).bit_length() - 1  # the carry of token t - 1 fills level j + 1
        merged = f" and levels 1..{j}" if j else ""
        carry = f"; token {t - 1}{merged} went into level {j + 1}"
        ax.set_yscale("log", base=2)
        top = 2 * max(2, occupancy.max())
        ax.set_ylim(0.06, top)
        powers = [2**i for i in range(int(top).bit_length()) if 2**i <= top]
        ax.set_yticks(powers, [str(p) for p in powers])  # plain labels: counts of keys, no fractional ticks
        ax.minorticks_off()
        ax.set_xticks(levels)
        ax.set_xlabel("level")
        ax.set_ylabel("keys held")
        live = int((keys > 0).sum())
        ax.set_title(f"after {t} token{'s' * (t != 1)} (t = 0b{t:b}): "
                     f"{live} level{'s' * (live != 1)} live{carry}", fontsize=9)

    return FuncAnimation(fig, frame, frames=range(1, steps + 1), interval=600)


# matplotlib's player draws its buttons with Font Awesome from a CDN; plain characters keep the page offline.
_BUTTON_TEXT = {
    "fa fa-fast-backward": "⇤", "fa fa-step-backward": "‹", "fa fa-play fa-flip-horizontal": "◀",
    "fa fa-pause": "❚❚", "fa fa-play": "▶", "fa fa-step-forward": "›", "fa fa-fast-forward": "⇥",
    "fa fa-minus": "−", "fa fa-plus": "+",
}


def to_html(animation: FuncAnimation):
    """The animation as a self-contained HTML player (``IPython.display.HTML``) that loads nothing from the
    network; closes its figure.
    """
    from IPython.display import HTML

    html = animation.to_jshtml(default_mode="once")
    plt.close(animation._fig)
    html = re.sub(r"<link[^>]*font-awesome[^>]*>", "", html)
    html = re.sub(r'<i class="(fa [^"]*)"></i>', lambda m: _BUTTON_TEXT.get(m.group(1), "·"), html)
    return HTML(html)
