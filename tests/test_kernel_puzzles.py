"""Chapter 8's kernel puzzles: every reference solution passes its checker, every typical mistake is caught with
its own hint, unfinished answers are reported (not raised), and the puzzles' PyTorch references put together
compute the package's log-linear attention.

The kernels run under Triton's interpreter on a CPU (TRITON_INTERPRET=1, set in conftest.py).
"""

import subprocess
import sys

import pytest
import torch

import loglin_edu as le
from loglin_edu import exercises as ex
from loglin_edu.exercises import ch08_kernel_puzzles as pz

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy's, from inside the interpreter
NAMES = [p.name for p in pz.PUZZLES]


def test_the_puzzles_are_chapter_8s_exercises():
    assert 6 <= len(pz.PUZZLES) <= 8
    assert all(ex.get(name).chapter == 8 for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_checker_accepts_the_solution(name):
    report = ex.check(name, ex.get(name).solution)
    assert report.passed, str(report)
    assert report.cases >= 2


@pytest.mark.parametrize("name", NAMES)
def test_checker_names_each_typical_mistake(name):
    puzzle = ex.get(name)
    assert len(puzzle.mistakes) >= 2
    for mistake, hint in puzzle.mistakes:
        report = ex.check(name, mistake)
        assert not report.passed, f"{name}: the checker accepted {mistake.__name__}"
        assert "on the case" in report.message and hint in report.message, report.message


@triton.jit
def _not_written(gc_ptr, out_ptr, C: tl.constexpr):
    raise NotImplementedError  # what the chapter's empty cells hold


@triton.jit
def _stores_nothing(gc_ptr, out_ptr, C: tl.constexpr):
    pass


def _not_a_kernel(gc_ptr, out_ptr, C):
    return tl.arange(0, C)


def test_unfinished_answers_are_reported_not_raised():
    assert "not attempted" in ex.check("kernels.decay_matrix", _not_written).message
    assert "stored nothing into out_ptr" in ex.check("kernels.decay_matrix", _stores_nothing).message
    report = ex.check("kernels.decay_matrix", _not_a_kernel)
    assert not report.passed and "@triton.jit" in report.message


def test_the_solutions_source_is_shown():
    shown = ex.show_solution("kernels.tree_slots").data
    assert "@triton.jit" in shown and "def tree_slots_kernel" in shown and "✔" in shown


def test_the_references_compose_into_loglinear_attention():
    """Intra-chunk product (puzzle 3) + level reads (6) of the slots (5) built from the leaves (4) = the package's
    naive log-linear attention; the decay (1) and level (2) references are the package's masks and levels."""
    gen = torch.Generator().manual_seed(0)
    N, C, K, V = 6, 8, 3, 4
    T, C_LOG = N * C, C.bit_length() - 1
    q, k, v = (torch.randn(T, d, generator=gen, dtype=torch.float64) for d in (K, K, V))
    g = -0.3 * torch.rand(T, generator=gen, dtype=torch.float64)
    lam = 0.5 + torch.rand(T, le.num_levels(T), generator=gen, dtype=torch.float64)
    gc = g.view(N, C).cumsum(1).flatten()
    gend = g.cumsum(0).view(N, C)[:, -1]
    chunks = [slice(c * C, (c + 1) * C) for c in range(N)]
    leaves = torch.stack([pz._leaf_reference(k[t], v[t], gc[t]) for t in chunks])
    nodes = pz._slots_reference(leaves, gend)
    intra = torch.cat([pz._intra_reference(q[t], k[t], v[t], gc[t], lam[t]) for t in chunks])
    ours = intra + pz.level_reads_reference(q, lam, gc, gend, nodes)
    expected = le.loglinear_attention(q[None, :, None], k[None, :, None], v[None, :, None], lam[None, :, None],
                                      g[None, :, None], form="naive")[0, :, 0]
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pz.decay_matrix(gc[:C]), le.decay_mask(g[None, :C, None])[0, 0])
    assert torch.equal(pz.levels(C).tril(), le.fenwick.levels_within_chunk(C).clamp_min(0))


def test_importing_the_puzzles_needs_no_triton():
    code = ("import sys; sys.modules['triton'] = None\n"  # any `import triton` now fails
            "from loglin_edu import exercises as ex\n"
            "assert 'kernels.decay_matrix' in ex.EXERCISES and ex.get('kernels.tree_slots').task")
    subprocess.run([sys.executable, "-c", code], check=True)
