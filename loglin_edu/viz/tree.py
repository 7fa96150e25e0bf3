"""The Fenwick tree of chunk states that the kernels build (chapter 8): which node each chunk writes, which
nodes each chunk reads.

Over chunks ``c = 0 .. N-1`` the segment tree has a node of height ``h`` for every aligned block of ``2^h``
chunks, the sum of its two children. A query chunk only ever reads *left* children, and the left child of
height ``h`` ending at chunk ``e`` is the one for which ``e + 1`` has exactly ``h`` trailing zeros — one node
per chunk. So the kernels keep an ``N``-slot buffer, slot ``e`` holding that node:

    written(c) = the node of height tz(c + 1) over chunks c + 1 - 2^h .. c            (stored in slot c)
    read(c)    = { ℓ: slot ((c >> ℓ) << ℓ) + 2^(ℓ-1) - 1 }  for every set bit ℓ - 1 of c   (height ℓ - 1)

Right children are built too (a parent is the decayed sum of both), but never stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ..fenwick import trailing_zeros
from .figures import LEVEL_COLORS


@dataclass(frozen=True)
class ChunkNode:
    """A node of the tree over chunks: the aligned block ``first .. last`` of ``2^height`` chunks."""

    height: int
    first: int
    last: int

    @property
    def stored(self) -> bool:
        """Left children are kept (in slot ``last``); right children are only merged into their parent."""
        return (self.first >> self.height) % 2 == 0

    @property
    def slot(self) -> int | None:
        """The buffer slot of a stored node (its last chunk), None for a right child."""
        return self.last if self.stored else None


def written_node(chunk: int) -> ChunkNode:
    """The node chunk ``c`` completes and stores in slot ``c``: height ``tz(c + 1)``, ending at ``c``."""
    if chunk < 0:
        raise ValueError(f"chunk must be >= 0, got {chunk}")
    height = trailing_zeros(chunk + 1)
    return ChunkNode(height, chunk + 1 - (1 << height), chunk)


def read_slots(chunk: int) -> dict[int, int]:
    """``{chunk level ℓ: slot}`` of the nodes chunk ``c`` reads: one per set bit ``ℓ - 1`` of ``c``, the left
    half of the aligned ``2^ℓ``-chunk block holding ``c`` (a node of height ``ℓ - 1``)."""
    if chunk < 0:
        raise ValueError(f"chunk must be >= 0, got {chunk}")
    return {lvl: ((chunk >> lvl) << lvl) + (1 << (lvl - 1)) - 1
            for lvl in range(1, chunk.bit_length() + 1) if (chunk >> (lvl - 1)) & 1}


def tree_nodes(n_chunks: int) -> list[ChunkNode]:
    """Every node of the tree over ``N`` chunks (complete aligned blocks inside ``0 .. N-1``), by height."""
    if n_chunks < 1:
        raise ValueError(f"n_chunks must be >= 1, got {n_chunks}")
    return [ChunkNode(h, b << h, ((b + 1) << h) - 1)
            for h in range(n_chunks.bit_length()) for b in range(n_chunks >> h)]


def draw_chunk_tree(n_chunks: int, ax=None, *, reader: int | None = None):
    """The tree over ``N`` chunks: stored (left) nodes filled and labelled with their slot, right children
    dashed. With ``reader = c``: the nodes chunk ``c`` reads, coloured by chunk level, and the node it writes,
    outlined. Returns the ``Axes``."""
    if reader is not None and not 0 <= reader < n_chunks:
        raise ValueError(f"reader must be a chunk in 0 .. {n_chunks - 1}, got {reader}")
    nodes = tree_nodes(n_chunks)
    height = max(n.height for n in nodes) + 1
    if ax is None:
        _, ax = plt.subplots(figsize=(min(1.0 + 0.45 * n_chunks, 11), 0.7 + 0.55 * height), layout="constrained")
    reads = {slot: lvl for lvl, slot in read_slots(reader).items()} if reader is not None else {}
    writes = written_node(reader) if reader is not None else None
    for node in nodes:
        x, y, w = node.first + 0.06, node.height + 0.1, node.last - node.first + 0.88
        if node.stored:
            level = reads.get(node.slot)
            face = LEVEL_COLORS[level % len(LEVEL_COLORS)] if level is not None else "#e8e8e8"
            ax.add_patch(Rectangle((x, y), w, 0.75, facecolor=face, edgecolor="#555555", lw=0.8))
            ax.text(x + w / 2, y + 0.37, str(node.slot), ha="center", va="center", fontsize=8,
                    color="white" if level is not None else "black")
        else:
            ax.add_patch(Rectangle((x, y), w, 0.75, facecolor="none", edgecolor="#aaaaaa", lw=0.8, ls="--"))
        if writes is not None and node == writes:
            ax.add_patch(Rectangle((x - 0.04, y - 0.05), w + 0.08, 0.85, facecolor="none", edgecolor="black", lw=2.2))
    if reader is not None:
        ax.annotate("", xy=(reader + 0.5, 0.05), xytext=(reader + 0.5, -0.6),
                    arrowprops=dict(arrowstyle="->", lw=1.5, color="black"))
        listed = ", ".join(f"slot {s} (level {lvl})" for lvl, s in sorted(read_slots(reader).items())) or "nothing"
        ax.set_title(f"chunk {reader} reads {listed}; it writes slot {reader} (outlined)", fontsize=9)
    ax.set_xlim(0, n_chunks)
    ax.set_ylim(-0.7 if reader is not None else 0, height)
    ax.set_xticks([c + 0.5 for c in range(n_chunks)], [str(c) for c in range(n_chunks)], fontsize=8)
    ax.set_yticks([h + 0.47 for h in range(height)], [str(h) for h in range(height)], fontsize=8)
    ax.set_xlabel("chunk")
    ax.set_ylabel("node height")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax


def draw_chunk_reads(n_chunks: int, ax=None):
    """Every chunk at once: row ``c`` marks the slots chunk ``c`` reads, coloured by chunk level, and the slot
    it writes (``W``, the diagonal). Returns the ``Axes``."""
    if n_chunks < 1:
        raise ValueError(f"n_chunks must be >= 1, got {n_chunks}")
    if ax is None:
        size = min(1.5 + 0.3 * n_chunks, 8)
        _, ax = plt.subplots(figsize=(size, size), layout="constrained")
    for c in range(n_chunks):
        for lvl, slot in read_slots(c).items():
            ax.add_patch(Rectangle((slot, c), 1, 1, facecolor=LEVEL_COLORS[lvl % len(LEVEL_COLORS)], edgecolor="white"))
        ax.text(c + 0.5, c + 0.5, "W", ha="center", va="center", fontsize=7, fontweight="bold")
    levels = sorted({lvl for c in range(n_chunks) for lvl in read_slots(c)})
    for lvl in levels:
        ax.add_patch(Rectangle((0, 0), 0, 0, facecolor=LEVEL_COLORS[lvl % len(LEVEL_COLORS)], label=f"chunk level {lvl}"))
    ax.set_xlim(0, n_chunks)
    ax.set_ylim(n_chunks, 0)
    ticks = [c + 0.5 for c in range(n_chunks)]
    ax.set_xticks(ticks, [str(c) for c in range(n_chunks)], fontsize=7)
    ax.set_yticks(ticks, [str(c) for c in range(n_chunks)], fontsize=7)
    ax.set_xlabel("slot (the node's last chunk)")
    ax.set_ylabel("chunk c")
    ax.set_aspect("equal")
    if levels:
        ax.legend(fontsize=7, loc="lower left")
    return ax
