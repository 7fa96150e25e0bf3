"""Every exercise's checker accepts its reference solution and rejects every typical mistake it knows, with
that mistake's hint; the solutions agree with the package where the checker compares with the solution."""

import pytest
import torch

import loglin_edu as le
from exercise_checks import assert_accepts_the_solution, mistake_reports
from loglin_edu import exercises as ex
from loglin_edu import layers
from loglin_edu.exercises import ch07_chunk_scan, ch10_layers
from loglin_edu.viz import stage_table

PUZZLE_CHAPTER = 8  # chapter 8's kernel puzzles: tests/test_kernel_puzzles.py
NAMES = [name for name, exercise in ex.EXERCISES.items() if exercise.chapter != PUZZLE_CHAPTER]


def test_every_chapter_has_two_to_four_exercises():
    per_chapter = {}
    for exercise in ex.EXERCISES.values():
        per_chapter[exercise.chapter] = per_chapter.get(exercise.chapter, 0) + 1
    assert set(range(1, 8)) | {9, 10, 11} <= set(per_chapter)  # Part I and the later chapters that have some
    assert 6 <= per_chapter.pop(PUZZLE_CHAPTER) <= 8
    assert all(2 <= n <= 4 for n in per_chapter.values()), per_chapter


@pytest.mark.parametrize("name", NAMES)
def test_checker_accepts_the_solution(name):
    assert_accepts_the_solution(name)


@pytest.mark.parametrize("name", NAMES)
def test_the_shown_solution_runs_on_its_own(name):
    """The code ``show_solution`` prints — the imports it needs, then the function — defines, in an empty
    namespace, a function the checker accepts: a reader can copy it into any page."""
    namespace = {}
    exec(compile(ex.solution_source(name), f"<solution of {name}>", "exec"), namespace)
    report = ex.check(name, namespace[ex.get(name).solution.__name__])
    assert report.passed, str(report)


@pytest.mark.parametrize("name", NAMES)
def test_checker_rejects_each_typical_mistake(name):
    assert ex.get(name).mistakes, f"{name} has no deliberately wrong function to show that its checker can fail"
    for hint, report in mistake_reports(name):
        if "level 0 should be empty" not in report.message:  # the carry's driver stops before comparing
            assert hint in report.message, report.message


@pytest.mark.parametrize("name", NAMES)
def test_unattempted_and_crashing_answers_are_reported_not_raised(name):
    def not_written(*args):
        raise NotImplementedError

    def crashes(*args):
        raise KeyError("oops")

    assert "not attempted" in ex.check(name, not_written).message
    report = ex.check(name, crashes)
    assert not report.passed and "KeyError" in report.message


def test_a_wrong_shape_is_named():
    report = ex.check("gated.decay_mask", lambda g: torch.zeros(g.shape[0], g.shape[1], g.shape[1]))
    assert not report.passed and "should have shape" in report.message


def test_an_in_place_edit_does_not_fool_the_checker():
    def edits_its_input(log_decay):
        log_decay.zero_()  # an all-ones mask then looks right only if the reference saw the edit
        return le.decay_mask(log_decay)

    assert not ex.check("gated.decay_mask", edits_its_input).passed


def test_stage_solution_agrees_with_the_level_table():
    for T, C in [(37, 4), (64, 8), (20, 1)]:
        table = stage_table(T, C)
        for t in range(T):
            for s in range(t + 1):
                where, lvl = ch07_chunk_scan.stage(t, s, C)
                if where == "intra":
                    assert table[t, s] == 0 and lvl == le.level(t, s) <= C.bit_length() - 1
                else:
                    assert table[t, s] == lvl >= 1 and le.level(t, s) == C.bit_length() - 1 + lvl


def test_chunk_sources_are_the_chunk_levels_of_the_scan():
    for c in range(1, 40):
        sources = ch07_chunk_scan.chunk_sources(c)
        for m, chunks in sources.items():
            assert all(le.fenwick.chunk_level(c, sc) == m for sc in chunks)
        read = sorted(sc for chunks in sources.values() for sc in chunks)
        assert read == list(range(c))  # every earlier chunk, each exactly once


def test_unknown_exercise_lists_the_names():
    with pytest.raises(ValueError, match="fenwick.level"):
        ex.check("nope", lambda: None)


def test_mamba2_log_decay_solution_is_the_layers_decay():
    torch.manual_seed(0)
    layer = layers.Mamba2(8, head_dim=4, d_state=4, chunk_size=4).double()
    u = torch.randn(2, 9, 8, dtype=torch.float64)
    dt_raw = layer.in_proj(u).split([layer.d_inner, layer.d_inner + 2 * layer.d_state, layer.num_heads], -1)[2]
    seen = {}
    mixer = layer.mixer

    def recording_mixer(q, k, v, log_decay, extra):
        seen["g"] = log_decay
        return mixer(q, k, v, log_decay, extra)

    layer.mixer = recording_mixer
    layer(u)
    torch.testing.assert_close(ch10_layers.mamba2_log_decay(dt_raw, layer.dt_bias, layer.A_log), seen["g"])
