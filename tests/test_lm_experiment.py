"""The language-modelling experiment: matched parameter counts, the CLI end to end on the cpu tier's data
(few steps), pieces that resume, merging run folders with an earlier results file, the throughput mode."""

import json
import os
import socket
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

from loglin_edu.data.lm_data import TextSpec
from loglin_edu.experiments import lm
from loglin_edu.layers import build_model, count_parameters
from loglin_edu.train.lm import LMTrainConfig


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


def test_the_triton_backend_reaches_the_layers_with_a_kernel_only():
    tier = replace(lm.TIERS["cpu"], backend="triton")
    backends = {m: lm.model_config(tier, m, 64).mixer_options["backend"] for m in lm.MODELS}
    assert backends == dict(transformer="auto", mamba2="triton", loglinear_mamba2="triton", gated_deltanet="triton",
                            loglinear_gated_deltanet="triton"), backends
    torch_tier = replace(tier, backend="torch")
    assert {lm.model_config(torch_tier, m, 64).mixer_options["backend"] for m in lm.MODELS} == {"torch"}


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        lm.main(["--help"])
    text = capsys.readouterr().out
    for option in ("--tier", "--out", "--results", "--seeds", "--models", "--max-minutes", "--merge", "--throughput"):
        assert option in text


VERSE = ("In the beginning God created the heaven and the earth. And the earth was without form, and void. "
         "And darkness was upon the face of the deep. And God said, Let there be light: and there was light.\n")


def tiny_tier(folder):
    """The cpu tier's code path at a size a test affords: local text files, one layer of width 32."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(6):
        (folder / f"book{i}.txt").write_text(f"Book {i}.\n" + VERSE * (40 + 10 * i))
    return replace(
        lm.TIERS["cpu"], text=TextSpec(sources=f"files:{folder}", vocab_size=300, held_out=0.3),
        train=LMTrainConfig(steps=4, batch_size=4, context=96, lr=3e-3, warmup_steps=1, eval_every=2, eval_windows=4,
                            eval_batch_size=4, amp=False),
        eval=lm.EvalSpec(windows=4, position_windows=4, needle_lengths=(192,), needle_depths=(0.0, 1.0),
                         needle_samples=1, needle_choices=3, multikey=2, level_windows=2, sample_tokens=4),
        d_model=32, n_layers=1, d_state=8, head_dim=16, gdn_heads=2, chunk_size=8,
    )


FAST = ["--tier", "tiny", "--no-progress"]


def test_cli_end_to_end_resumes_and_merges(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(lm.TIERS, "tiny", tiny_tier(tmp_path / "books"))
    monkeypatch.setenv("LOGLIN_COMMIT", "0123abc")
    out, results = tmp_path / "out", tmp_path / "results"
    # a piece with no time left trains nothing, and says so
    lm.main(FAST + ["--out", str(out), "--models", "transformer", "--max-minutes", "0", "--results", str(results)])
    assert "runs remain" in capsys.readouterr().out
    lm.main(FAST + ["--out", str(out), "--models", "transformer,loglinear_gated_deltanet", "--results", str(results)])
    result = json.loads((results / "lm_tiny.json").read_text())
    assert result["commit"] == "0123abc" and result["command"].startswith("python -m loglin_edu.experiments.lm")
    assert {"torch", "tokenizers"} <= set(result["versions"]) and result["device"] and result["date"]
    assert all(r["commit"] == "0123abc" and r["device"] and "torch" in r["versions"] for r in result["runs"])
    runs = [(r["model_name"], r["seed"]) for r in result["runs"]]
    assert runs == [("transformer", 0), ("loglinear_gated_deltanet", 0)]
    assert result["data"]["vocab_size"] == 300 and result["data"]["validation"]["documents"] >= 1
    run = result["runs"][1]["evaluation"]
    assert len(run["loss_by_position"]) == 192 and run["validation"]["tokens"] == 4 * 96
    assert len(run["needle_single"]["choice"]) == 1 and len(run["needle_multikey"]["greedy"][0]) == 2
    assert [len(layer) for layer in run["level_weights"]] == [2] and len(run["level_weights"][0][0]) == 9
    assert result["runs"][0]["evaluation"]["level_weights"] == []
    assert len(result["runs"][0]["evaluation"]["sample"]["continuation"]) > 0
    assert set(result["summary"]["models"]) == {"transformer", "loglinear_gated_deltanet"}
    # a second output folder with another run: merging keeps the earlier file's runs
    other = tmp_path / "other"
    lm.main(FAST + ["--out", str(other), "--models", "mamba2", "--no-merge"])
    lm.main(["--tier", "tiny", "--out", str(other), "--merge", "--results", str(results)])
    merged = json.loads((results / "lm_tiny.json").read_text())
    assert [r["model_name"] for r in merged["runs"]] == ["transformer", "mamba2", "loglinear_gated_deltanet"]
    # throughput on one process: both measurements run, efficiency is their ratio
    lm.main(FAST + ["--out", str(out), "--throughput", "--throughput-steps", "2", "--models", "mamba2",
                    "--results", str(results)])
    scaling = json.loads((results / "lm_ddp_scaling.json").read_text())
    row = scaling["models"][0]
    assert scaling["gpus"] == 1 and row["model"] == "mamba2"
    assert row["efficiency"] == pytest.approx(row["tokens_per_second_n"] / row["tokens_per_second_1"])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, port, books, argv):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    lm.TIERS["tiny"] = tiny_tier(books)
    lm.main(argv)


@pytest.mark.slow
def test_cli_under_two_gloo_ranks_trains_measures_and_scales(tmp_path):
    """The CLI as torchrun runs it (two ranks, gloo on the CPU): rank 0 prepares the data, both train, rank 0
    writes one record per run; the throughput mode times rank 0 alone, then both."""
    tiny_tier(tmp_path / "books")
    out, results = tmp_path / "out", tmp_path / "results"
    run = FAST + ["--out", str(out), "--models", "loglinear_mamba2", "--results", str(results)]
    mp.start_processes(_rank, args=(_free_port(), tmp_path / "books", run), nprocs=2, join=True, start_method="spawn")
    result = json.loads((results / "lm_tiny.json").read_text())
    assert result["command"].startswith("torchrun --nproc_per_node 2")
    (record,) = result["runs"]
    assert record["world_size"] == 2 and record["complete"] and record["evaluation"]["needle_single"]["choice"]
    scale = FAST + ["--out", str(out), "--throughput", "--throughput-steps", "1", "--models", "transformer",
                    "--results", str(results)]
    mp.start_processes(_rank, args=(_free_port(), tmp_path / "books", scale), nprocs=2, join=True, start_method="spawn")
    assert json.loads((results / "lm_ddp_scaling.json").read_text())["gpus"] == 2


@pytest.mark.slow
def test_parallel_runs_on_one_device(tmp_path):
    """--jobs: each run in its own worker process (sharing the prepared data), then one merged results file."""
    books = tmp_path / "books"
    tiny_tier(books)
    out, results = tmp_path / "out", tmp_path / "results"
    lm.main(["--tier", "cpu", "--corpus", f"files:{books}", "--steps", "2", "--models", "transformer,mamba2",
             "--jobs", "2", "--out", str(out), "--results", str(results), "--no-progress"])
    result = json.loads((results / "lm_cpu.json").read_text())
    assert [r["model_name"] for r in result["runs"]] == ["transformer", "mamba2"] and not result["incomplete"]
    assert all((out / "runs" / f"{m}-s0" / "stdout.txt").exists() for m in ("transformer", "mamba2"))
