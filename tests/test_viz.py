"""The book's figures: the data they draw is right (blocks, stages, binary counter), and they render."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

import loglin_edu as le
from loglin_edu import viz


@pytest.mark.parametrize("T", [1, 2, 3, 7, 8, 13, 32, 33])
def test_fenwick_blocks_cover_every_strictly_causal_pair_once_at_its_level(T):
    levels = le.level_matrix(T)
    seen = torch.zeros(T, T, dtype=torch.long)
    for block in viz.fenwick_blocks(T):
        for t in block.rows:
            for s in block.cols:
                assert levels[t, s] == block.level
                seen[t, s] += 1
    assert torch.equal(seen, torch.ones(T, T, dtype=torch.long).tril(-1))


@pytest.mark.parametrize("T", [9, 32])
def test_blocks_of_the_loglinear_mask_have_rank_one(T):
    gen = torch.Generator().manual_seed(0)
    lam = torch.rand(1, T, 1, le.num_levels(T), generator=gen, dtype=torch.float64) + 0.5
    g = -torch.rand(1, T, 1, generator=gen, dtype=torch.float64)
    mask = le.loglinear_mask(lam, g)[0, 0]
    for block in viz.fenwick_blocks(T):
        sub = mask[block.rows.start : block.rows.stop, block.cols.start : block.cols.stop]
        assert torch.linalg.matrix_rank(sub).item() == 1


def test_binary_counter_holds_the_bucket_sizes_of_each_query():
    table = viz.counter_occupancy(40)
    for t in range(40):
        sizes = [len(b) for b in le.buckets(t)]
        assert list(table[t, : len(sizes)]) == sizes and not table[t, len(sizes):].any()


@pytest.mark.parametrize("T,C", [(64, 8), (37, 4), (16, 16), (10, 1)])
def test_stage_table_matches_chunk_geometry(T, C):
    table = viz.stage_table(T, C)
    log_c = C.bit_length() - 1
    for t in range(T):
        for s in range(T):
            if s > t:
                assert table[t, s] == -1
            elif t // C == s // C:
                assert table[t, s] == 0
            else:
                assert table[t, s] == le.fenwick.chunk_level(t // C, s // C) == le.level(t, s) - log_c


def test_explorer_masks_follow_the_controls():
    m_h, m_s = viz.explore.explorer_masks(8, [1.0, 0.5, 2.0, 3.0], -0.25)
    assert m_h[5, 4] == 0.5 and m_h[6, 4] == 2.0 and m_h[7, 0] == 3.0 and m_h[3, 3] == 1.0
    assert torch.allclose(m_s[7, 3], torch.tensor(np.exp(-1.0), dtype=torch.float64))


def test_figures_and_animations_render():
    import matplotlib.pyplot as plt

    viz.draw_levels(8, query=5)
    viz.draw_buckets(6, seq_len=8)
    viz.draw_binary_counter(8)
    viz.draw_stages(16, 4)
    viz.draw_series([2, 4], {"a": [1, 2]}, ylabel="x")
    viz.explore.draw_explorer(8, 5, 2, [1.0] * 4, -0.1)
    plt.close("all")
    html = viz.to_html(viz.query_animation(4)).data
    assert html.count("data:image/png;base64") >= 1 and 'type="range"' in html
    assert "http" not in html and "fa-play" not in html  # nothing to fetch: the page works offline
    assert not plt.get_fignums()  # to_html closed the figure


def test_widgets_build_without_a_kernel():
    pytest.importorskip("ipywidgets")
    box = viz.mask_explorer()
    assert len(box.children) == 2
    assert len(viz.bucket_explorer().children) == 2


def test_macros_render_as_newcommands():
    text = viz.notation.newcommands()
    assert text.count("\\newcommand") == len(viz.MACROS) and "\\newcommand{\\MH}" in text


def test_matmul_flops_counts_two_per_multiply_add():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    assert viz.matmul_flops(lambda: a @ b) == 2 * 3 * 5 * 7
    assert viz.matmul_flops(lambda: a + 1) == 0


def test_decoding_buffer_holds_the_bucket_sizes_like_the_list_state():
    buffer = viz.buffer_occupancy(40)
    assert not buffer[0].any()
    listed = viz.counter_occupancy(40)
    assert np.array_equal(buffer[1:, : listed.shape[1]], listed)


def test_decoding_figures_render():
    import matplotlib.pyplot as plt

    html = viz.to_html(viz.counter_animation(6)).data
    assert html.count("data:image/png;base64") >= 1 and "http" not in html
    rows = [dict(name=n, batch=1, context=T, step_ms=0.1 * T, state_bytes=T) for n in ("a", "b") for T in (4, 8)]
    rows.append(dict(name="c", batch=1, context=8, skipped="too big"))
    ax = viz.draw_decode_results({"rows": rows}, "step_ms", batch=1)
    assert len(ax.get_lines()) == 3
    plt.close("all")
