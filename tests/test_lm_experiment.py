"""The language-modelling experiment: matched parameter counts, the CLI end to end on the cpu tier's data
(few steps), pieces that resume, merging run folders with an earlier results file, the throughput mode."""

import json

import pytest

from loglin_edu.experiments import lm
from loglin_edu.layers import build_model, count_parameters


@pytest.mark.parametrize("tier", ["cpu", pytest.param("gpu", marks=pytest.mark.slow)], ids=lambda name: f"{name}-tier")
def test_parameter_counts_are_matched_within_5_percent(tier):
    t = lm.TIERS[tier]
    counts = {m: count_parameters(build_model(lm.model_config(t, m, t.text.vocab_size))) for m in lm.MODELS}
    base = counts["transformer"]
    for m, c in counts.items():
        for key in ("total", "non_embedding"):
            assert abs(c[key] / base[key] - 1) <= 0.05, (tier, m, key, c[key], base[key])
    if tier == "gpu":
        assert all(20e6 <= c["total"] <= 40e6 for c in counts.values())
        assert lm.model_config(t, "loglinear_mamba2", 8192).max_len == 2 * t.train.context == 4096
    else:
        assert all(0.8e6 <= c["total"] <= 1.2e6 for c in counts.values())


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        lm.main(["--help"])
    text = capsys.readouterr().out
    for option in ("--tier", "--out", "--results", "--seeds", "--models", "--max-minutes", "--merge", "--throughput"):
        assert option in text


FAST = ["--tier", "cpu", "--steps", "4", "--no-progress"]


@pytest.mark.slow
def test_cli_end_to_end_resumes_and_merges(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOGLIN_COMMIT", "0123abc")
    out, results = tmp_path / "out", tmp_path / "results"
    # a piece with no time left trains nothing, and says so
    lm.main(FAST + ["--out", str(out), "--models", "transformer", "--max-minutes", "0", "--results", str(results)])
    assert "runs remain" in capsys.readouterr().out
    lm.main(FAST + ["--out", str(out), "--models", "transformer,loglinear_gated_deltanet", "--results", str(results)])
    result = json.loads((results / "lm_cpu.json").read_text())
    assert result["commit"] == "0123abc" and result["command"].startswith("python -m loglin_edu.experiments.lm")
    assert {"torch", "tokenizers", "device", "date"} <= set(result["environment"])
    runs = [(r["model_name"], r["seed"]) for r in result["runs"]]
    assert runs == [("transformer", 0), ("loglinear_gated_deltanet", 0)]
    assert result["data"]["vocab_size"] == 4096 and result["data"]["validation"]["documents"] >= 2
    run = result["runs"][1]["evaluation"]
    assert len(run["loss_by_position"]) == 256 and run["validation"]["tokens"] == 32 * 128
    assert len(run["needle_single"]["choice"]) == 1 and len(run["needle_multikey"]["greedy"][0]) == 3
    assert [len(layer) for layer in run["level_weights"]] == [2, 2] and len(run["level_weights"][0][0]) == 9
    assert result["runs"][0]["evaluation"]["level_weights"] == []
    assert set(result["summary"]["models"]) == {"transformer", "loglinear_gated_deltanet"}
    # a second output folder with another run: merging keeps the earlier file's runs
    other = tmp_path / "other"
    lm.main(FAST + ["--out", str(other), "--models", "mamba2", "--no-merge"])
    lm.main(["--tier", "cpu", "--out", str(other), "--merge", "--results", str(results)])
    merged = json.loads((results / "lm_cpu.json").read_text())
    assert [r["model_name"] for r in merged["runs"]] == ["transformer", "mamba2", "loglinear_gated_deltanet"]
    # throughput on one process: both measurements run, efficiency is their ratio
    lm.main(["--tier", "cpu", "--out", str(out), "--throughput", "--throughput-steps", "2", "--models", "mamba2",
             "--results", str(results)])
    scaling = json.loads((results / "lm_ddp_scaling.json").read_text())
    row = scaling["models"][0]
    assert scaling["gpus"] == 1 and row["model"] == "mamba2"
    assert row["efficiency"] == pytest.approx(row["tokens_per_second_n"] / row["tokens_per_second_1"])
