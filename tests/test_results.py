"""The results files are found through the installed package (``loglin_edu.viz.results``), every one of them
parses, and every one carries the provenance its caption is made from."""

import json
from pathlib import Path

import pytest

from loglin_edu.viz import results

RESULTS = Path(__file__).resolve().parents[1] / "book" / "results"


def test_every_results_file_of_the_repository_is_found():
    assert results.names() == sorted(p.name for p in RESULTS.glob("*.json"))
    assert results.names(".png") == sorted(p.name for p in RESULTS.glob("*.png"))


@pytest.mark.parametrize("name", sorted(p.stem for p in RESULTS.glob("*.json")))
def test_load_returns_the_file_and_its_caption_names_the_device(name):
    record = results.load(name)
    assert record == json.loads((RESULTS / f"{name}.json").read_text())
    assert record == results.load(name + ".json")
    caption = results.caption(record)
    assert caption.split(" · ")[0] != "unknown device", caption


def test_caption_lists_device_versions_and_date_and_the_commit_only_when_asked():
    record = {"commit": "abc1234", "date": "2026-01-02T03:04:05+00:00",
              "versions": {"device": "GPU X", "torch": "2.9", "triton": "3.6.0", "fla-core": "not installed"}}
    assert results.caption(record) == "GPU X · torch 2.9 · triton 3.6.0 · 2026-01-02"
    assert results.caption(record, commit=True).endswith(" · code abc1234")
    long = dict(record, commit="240ce3e1c0e041f43463f404920bb6f2a0629b80")
    assert results.caption(long, commit=True).endswith(" · code 240ce3e")


def test_an_unknown_name_lists_the_files():
    with pytest.raises(ValueError, match="kernels_h200.json"):
        results.load("no_such_result")


def test_plots_are_read_as_bytes():
    for name in results.names(".png"):
        assert results.read_bytes(name)[:8] == b"\x89PNG\r\n\x1a\n"


def recorded_configs(record):
    """Every launch configuration a results record holds: of a run (``config``) or of its rows."""
    rows = [r for key in ("variants", "rows") for r in record.get(key, []) if isinstance(r, dict)]
    return [c for c in [record.get("config"), *(r.get("config") for r in rows)] if isinstance(c, dict)]


@pytest.mark.parametrize("name", sorted(p.stem for p in RESULTS.glob("*.json")))
def test_recorded_launch_configurations_still_build(name):
    """A chapter compares recorded configurations by rebuilding them (``LaunchConfig(**config)``): every one must
    still be a configuration of one of the kernels, the fields a record lacks taking their defaults."""
    from loglin_edu.kernels.config import DeltaLaunchConfig, LaunchConfig, LinearLaunchConfig

    for config in recorded_configs(results.load(name)):
        fits = []
        for kind in (LaunchConfig, DeltaLaunchConfig, LinearLaunchConfig):
            try:
                fits.append(kind(**config))
            except TypeError:
                pass
        assert fits, config


def test_the_results_hold_recorded_launch_configurations():
    """The test above has something to check: the variants files record their configurations."""
    assert sum(len(recorded_configs(results.load(name))) for name in results.names()) >= 10
