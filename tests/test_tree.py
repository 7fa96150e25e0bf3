"""The tree over chunks of chapter 8's figure: what each chunk writes and reads is the Fenwick partition of the
chunks (checked against ``fenwick.chunk_level``), and the figures draw it."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from loglin_edu import fenwick  # noqa: E402
from loglin_edu.viz.tree import ChunkNode, draw_chunk_reads, draw_chunk_tree, read_slots, tree_nodes, written_node  # noqa: E402


def test_the_nodes_a_chunk_reads_cover_every_earlier_chunk_once_at_its_chunk_level():
    for c in range(70):
        covered = []
        for lvl, slot in read_slots(c).items():
            node = written_node(slot)
            assert node.stored and node.height == lvl - 1
            block = range(node.first, node.last + 1)
            assert all(fenwick.chunk_level(c, sc) == lvl for sc in block)
            covered += block
        assert sorted(covered) == list(range(c))


def test_a_chunk_writes_the_left_node_it_completes():
    for c in range(70):
        node = written_node(c)
        assert node.last == c and node.stored and node.slot == c
        assert node.last - node.first + 1 == 2**node.height and node.first % 2**node.height == 0
        assert (c + 1) % 2 ** (node.height + 1) != 0  # exactly `height` trailing zeros in c + 1


@pytest.mark.parametrize("n_chunks", [1, 5, 8, 13, 16])
def test_the_stored_nodes_are_the_written_ones(n_chunks):
    stored = {n for n in tree_nodes(n_chunks) if n.stored}
    assert stored == {written_node(e) for e in range(n_chunks)}
    assert all(not n.stored and n.slot is None for n in tree_nodes(n_chunks) if n not in stored)
    assert ChunkNode(0, 1, 1) in tree_nodes(n_chunks) or n_chunks == 1


def test_figures_draw_and_refuse_bad_input():
    ax = draw_chunk_tree(13, reader=11)
    assert "chunk 11 reads" in ax.get_title() and len(ax.patches) > 13
    assert len(draw_chunk_reads(9).patches) >= sum(len(read_slots(c)) for c in range(9))
    plt.close("all")
    with pytest.raises(ValueError, match="reader"):
        draw_chunk_tree(8, reader=8)
    with pytest.raises(ValueError, match="chunk"):
        written_node(-1)
    with pytest.raises(ValueError, match="n_chunks"):
        tree_nodes(0)
