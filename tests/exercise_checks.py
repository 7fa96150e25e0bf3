"""What the exercise tests share: a checker accepts its solution, and each typical mistake is reported."""

from loglin_edu import exercises as ex


def assert_accepts_the_solution(name: str) -> None:
    """The checker of exercise ``name`` passes its reference solution, on at least two cases."""
    report = ex.check(name, ex.get(name).solution)
    assert report.passed, str(report)
    assert report.cases >= 2


def mistake_reports(name: str):
    """``(hint, report)`` for each typical mistake of exercise ``name``, each checked to fail on a
    named case."""
    for mistake, hint in ex.get(name).mistakes:
        report = ex.check(name, mistake)
        assert not report.passed, f"{name}: the checker accepted the mistake {mistake.__name__}"
        assert "on the case" in report.message, report.message
        yield hint, report
