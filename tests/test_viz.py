"""The book's figures: the data they draw is right (blocks, stages, binary counter), and they render."""

import importlib.resources
import json
import re
import shutil
import subprocess
import time

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


def test_bucket_labels_only_where_they_fit():
    """Query 46 on a strip of 64 keys: buckets of 1 and 2 keys go unlabelled, 4 and 8 keys get a short label, the
    half-strip bucket its full name."""
    import matplotlib.pyplot as plt

    ax = viz.draw_buckets(46, seq_len=64)
    labels = sorted(text.get_text() for text in ax.texts)
    plt.close(ax.figure)
    assert labels == ["", "", "level 6: 0..31", "ℓ=3", "ℓ=4"]


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
    calls = []
    assert viz.median_seconds(lambda: calls.append(1), repeats=5) >= 0 and len(calls) == 5


def test_best_median_seconds_keeps_the_least_disturbed_median():
    delays = iter([0.03, 0.03, 0.03, 0.0, 0.0, 0.0])  # a disturbed round, then a quiet one
    calls = []

    def work():
        calls.append(1)
        time.sleep(next(delays))

    threads = torch.get_num_threads()
    assert viz.best_median_seconds(work, repeats=3, rounds=2) < 0.02 and len(calls) == 6
    assert torch.get_num_threads() == threads  # restored after measuring on one thread
    with pytest.raises(ValueError, match="rounds"):
        viz.best_median_seconds(work, rounds=0)


# ---------------------------------------------------------------- the browser explorers' JavaScript

NODE = shutil.which("node")
EXPLORERS_JS = importlib.resources.files("loglin_edu.viz") / "explorers.js"


def run_explorer_math(expression: str):
    """Evaluate ``expression`` (JavaScript, with ``m`` the explorers' math) in node and return its JSON value."""
    if NODE is None:
        pytest.skip("node is missing (apt-get install nodejs): the explorers' JavaScript cannot be run")
    script = (
        "const vm = require('vm'), fs = require('fs');"
        f"vm.runInThisContext(fs.readFileSync({json.dumps(str(EXPLORERS_JS))}, 'utf8'));"
        f"const m = globalThis.loglinExplorers.math; process.stdout.write(JSON.stringify({expression}));"
    )
    done = subprocess.run([NODE, "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


LENGTHS = [1, 2, 3, 7, 8, 13, 16, 33, 64]


def test_browser_levels_and_level_counts_match_the_package():
    tables = run_explorer_math(f"{LENGTHS}.map(T => m.levelMatrix(T))")
    for T, table in zip(LENGTHS, tables):
        assert torch.equal(torch.tensor(table), le.level_matrix(T)), T
    counts = run_explorer_math("[1, 2, 3, 4, 5, 8, 9, 1024, 1025, 16384, 16385].map(T => m.numLevels(T))")
    assert counts == [le.num_levels(T) for T in (1, 2, 3, 4, 5, 8, 9, 1024, 1025, 16384, 16385)]


def test_browser_masks_match_the_package_masks():
    lambdas = [1.0, 0.5, 2.0, 0.25, 1.5, 0.75, 1.25]
    for T, g in ((13, -0.3), (33, -0.05), (64, 0.0)):
        m_h, m_s = run_explorer_math(f"[m.hierarchicalMask({T}, {lambdas}), m.decayMask({T}, {g})]")
        ref_h, ref_s = viz.explore.explorer_masks(T, lambdas, g)
        torch.testing.assert_close(torch.tensor(m_h, dtype=torch.float64), ref_h, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.tensor(m_s, dtype=torch.float64), ref_s, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T,C", [(64, 8), (37, 4), (16, 16), (100, 2)])
def test_browser_stage_table_matches_the_package(T, C):
    assert torch.equal(torch.tensor(run_explorer_math(f"m.stageTable({T}, {C})")), viz.stage_table(T, C))


def test_browser_decoding_state_matches_the_measured_binary_counter():
    steps = 40
    occupancy = viz.counter_occupancy(steps)  # measured with the package's FenwickState
    held = run_explorer_math(
        f"[...Array({steps}).keys()].map(t => m.decodingLevels(t, {occupancy.shape[1]}).map(k => k ? k[1] - k[0] : 0))"
    )
    assert np.array_equal(np.array(held), occupancy)
    carries = run_explorer_math(f"[...Array({steps - 1}).keys()].map(i => m.carry(i + 1))")
    for t, step in enumerate(carries, start=1):
        before, after = occupancy[t - 1], occupancy[t]
        grown = [lvl for lvl in range(1, len(after)) if after[lvl] and not before[lvl]]
        assert grown == [step["into"]] and before[: step["into"]].sum() == step["keys"][1] - step["keys"][0]


def test_browser_lowest_set_bit_strips_are_the_fenwick_buckets():
    strips = run_explorer_math("[...Array(200).keys()].map(t => m.lssbStrips(t))")
    for t, found in enumerate(strips):
        expected = [(lvl, b.start, b.stop) for lvl, b in enumerate(le.buckets(t)) if lvl and len(b)]
        assert sorted((s["level"], s["start"], s["stop"]) for s in found) == expected


def test_browser_explorers_are_self_contained_html():
    pages = [viz.browser.bucket_explorer(), viz.browser.mask_explorer(), viz.browser.decoding_explorer(),
             viz.browser.scan_explorer()]
    for page in pages:
        html = page.data
        assert "loglinExplorers.mount(" in html and viz.browser.explorer_script() in html
        assert not re.search(r"""(src|href)\s*=|https?://|import\(|fetch\(""", html)  # nothing is loaded
    assert len({re.search(r'id="([^"]+)"', p.data).group(1) for p in pages}) == len(pages)


def test_browser_explorers_reject_bad_settings():
    with pytest.raises(ValueError, match="query"):
        viz.browser.bucket_explorer(seq_len=8, query=8)
    with pytest.raises(TypeError, match="seq_len"):
        viz.browser.decoding_explorer(seq_len=8.0)
    with pytest.raises(ValueError, match="chunk_size"):
        viz.browser.mask_explorer(chunk_size=3)
    with pytest.raises(ValueError, match="lambdas"):
        viz.browser.mask_explorer(lambdas=[1.0, 2.0])


def test_decoding_buffer_holds_the_bucket_sizes_of_the_next_query():
    """After t tokens slot i holds bucket i + 1 of query t: 2^i keys where bit i of t is set; for 32 steps the
    buffer has room for 33 tokens, so the state after 32 (one level-6 bucket) fits."""
    for steps in (40, 32):
        buffer = viz.buffer_occupancy(steps)
        assert buffer.shape == (steps + 1, steps.bit_length())
        for t in range(steps + 1):
            assert buffer[t].tolist() == [len(le.bucket(t, i + 1)) for i in range(buffer.shape[1])], (steps, t)


def test_decoding_figures_render():
    import matplotlib.pyplot as plt

    html = viz.to_html(viz.counter_animation(6)).data
    assert html.count("data:image/png;base64") >= 1 and "http" not in html
    rows = [dict(name=n, batch=1, context=T, step_ms=0.1 * T, state_bytes=T) for n in ("a", "b") for T in (4, 8)]
    rows.append(dict(name="c", batch=1, context=8, skipped="too big"))
    ax = viz.draw_decode_results({"rows": rows}, "step_ms", batch=1)
    assert len(ax.get_lines()) == 3
    rows = [dict(name=n, batch=1, context=T, step_ms=0.1 * T) for n in viz.DECODE_LABELS for T in (4, 8)]
    ax = viz.draw_decode_results({"rows": rows}, "step_ms", batch=1)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(viz.DECODE_LABELS.values())
    assert ax.get_legend().get_bbox_to_anchor().y1 < ax.get_window_extent().y0  # below the axes, off the data
    plt.close("all")


def test_counter_animation_titles_count_in_the_singular_and_plural():
    import matplotlib.pyplot as plt

    animation = viz.counter_animation(4)
    titles = {}
    for t in (1, 2, 3, 4):
        animation._func(t)
        titles[t] = animation._fig.axes[0].get_title()
    assert titles[1].startswith("after 1 token (") and ": 1 level live" in titles[1]
    for t in (2, 3, 4):  # one level per set bit of t: the buckets of the next query
        live = bin(t).count("1")
        assert titles[t].startswith(f"after {t} tokens (") and f": {live} level{'s' * (live > 1)} live" in titles[t]
    assert titles[4].endswith("token 3 and levels 1..2 went into level 3")
    viz.to_html(animation)  # renders the frames and closes the figure
    plt.close("all")
