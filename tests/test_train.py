"""Training: resumes bit-exactly from a checkpoint on the CPU, members of an ensemble train independently,
the schedule and the experiment CLI do what they say."""

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from loglin_edu.data import lagged_recall, mqar
from loglin_edu.data.tokenizer import write_text_atomic
from loglin_edu.experiments import mqar as experiment
from loglin_edu.experiments.mqar.__main__ import main as experiment_main
from loglin_edu.experiments.mqar.jobs import tier_from_dict, tier_to_dict
from loglin_edu.layers import ModelConfig
from loglin_edu.provenance import temporary_path, write_json
from loglin_edu.train import Member, TrainConfig, lr_factor, save_atomic, train

TRAIN = [mqar(64, 16, 2, 32, seed=1), mqar(64, 16, 4, 32, seed=2)]
TEST = {"pairs=2": mqar(16, 16, 2, 32, seed=3), "pairs=4": mqar(16, 16, 4, 32, seed=4)}


def config(name="loglinear_gated_deltanet"):
    return ModelConfig(name, vocab_size=32, d_model=16, max_len=16, mixer_options=dict(backend="torch", chunk_size=4))


MEMBERS = [Member(0, 3e-3), Member(1, 1e-2)]


def weights(record_dir):
    state = torch.load(record_dir / "checkpoint.pt", weights_only=False)
    return state["models"]


def log_lines(path):
    lines = [json.loads(line) for line in (path / "log.jsonl").read_text().splitlines()]
    for line in lines:
        line.pop("seconds")
    return lines


@pytest.mark.parametrize("name", ["loglinear_gated_deltanet", "loglinear_mamba2"])
def test_training_resumes_bit_exactly(tmp_path, name):
    cfg = TrainConfig(steps=8, batch_size=8, warmup_steps=3, eval_every=3, checkpoint_every=2)
    straight = train(config(name), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "a", progress=False)
    first = train(config(name), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "b", progress=False, stop_at=5)
    assert not first["complete"] and first["steps_done"] == 5
    # a crash after the last checkpoint: the log got a line the checkpoint does not hold
    with (tmp_path / "b" / "log.jsonl").open("a") as f:
        f.write(json.dumps(dict(step=7, seconds=0.0)) + "\n")
    resumed = train(config(name), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "b", progress=False)
    assert resumed["complete"]
    for a, b in zip(weights(tmp_path / "a"), weights(tmp_path / "b")):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert log_lines(tmp_path / "a") == log_lines(tmp_path / "b")
    assert [h["step"] for h in straight["history"]] == [3, 3, 6, 6, 8, 8]


def test_a_deadline_stops_evaluates_and_the_run_resumes(tmp_path):
    """A run out of wall-clock time stops after the step it is in, evaluates there and checkpoints; a later
    call without a deadline finishes it with the weights of an uninterrupted run."""
    import time

    cfg = TrainConfig(steps=6, batch_size=8, warmup_steps=2, eval_every=3)
    straight = train(config(), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "a", progress=False)
    stopped = train(config(), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "b", progress=False, deadline=time.time())
    assert not stopped["complete"] and stopped["steps_done"] == 1
    assert [h["step"] for h in stopped["history"]] == [1, 1] and stopped["final"] == stopped["history"]
    resumed = train(config(), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "b", progress=False)
    assert resumed["complete"] and [h["step"] for h in resumed["history"]] == [1, 1, 3, 3, 6, 6]
    for a, b in zip(weights(tmp_path / "a"), weights(tmp_path / "b")):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert straight["final"][0]["accuracy"] == resumed["final"][0]["accuracy"]


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    cfg = TrainConfig(steps=2, batch_size=4, warmup_steps=1, eval_every=2)
    train(config(), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="another run"):
        train(config(), [Member(5, 1e-3)], TRAIN, TEST, cfg, out_dir=tmp_path, progress=False)
    assert not list(tmp_path.glob("*.tmp"))


def test_members_train_as_if_alone():
    """Member 1 of an ensemble ends with the weights it gets when trained by itself (same seed, same data)."""
    cfg = TrainConfig(steps=4, batch_size=8, warmup_steps=2, eval_every=4)
    together = train(config(), MEMBERS, TRAIN, TEST, cfg, progress=False)
    alone = train(config(), MEMBERS[1:], TRAIN, TEST, cfg, progress=False)
    assert together["final"][1]["train_loss"] == pytest.approx(alone["final"][0]["train_loss"], rel=1e-5)
    assert together["final"][1]["accuracy"] == pytest.approx(alone["final"][0]["accuracy"])


def test_level_scales_are_averaged_where_the_queries_read_them():
    """λ by level: the mean over heads and over the queries whose bucket of that level holds keys (a loop)."""
    from loglin_edu.layers import LevelScales, build_model
    from loglin_edu.train.evaluate import level_scales_at_queries

    model = build_model(config("loglinear_mamba2"), seed=0)
    test = lagged_recall(6, 16, 3, 4, 32, seed=5)  # queries at many positions, so most levels are read
    captured = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: captured.append(out)) for m in model.modules()
             if isinstance(m, LevelScales)]
    got = level_scales_at_queries(model, test, count=6)
    for hook in hooks:
        hook.remove()
    assert len(got) == len(captured) == 2
    for lam, means in zip(captured, got):
        for level, mean in enumerate(means):
            values = [lam[n, t, :, level].mean().item() for n in range(6) for t in test.query_positions[n].tolist()
                      if level == 0 or (t >> (level - 1)) & 1]
            assert (mean is None) == (not values)
            if values:
                assert mean == pytest.approx(sum(values) / len(values), rel=1e-5)
    assert level_scales_at_queries(build_model(config("mamba2"), seed=0), test) is None


def test_schedule_warms_up_then_decays_to_zero():
    assert lr_factor(0, 10, 100) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100) == pytest.approx(1.0)
    assert lr_factor(10, 10, 100) == pytest.approx(1.0)
    assert lr_factor(55, 10, 100) == pytest.approx(0.5)
    assert lr_factor(100, 10, 100) == pytest.approx(0.0, abs=1e-12)
    assert all(lr_factor(s, 10, 100) >= lr_factor(s + 1, 10, 100) for s in range(10, 100))


def test_save_is_atomic(tmp_path):
    path = tmp_path / "x.pt"
    save_atomic({"a": torch.ones(2)}, path)
    assert torch.equal(torch.load(path)["a"], torch.ones(2)) and not list(tmp_path.glob("*.tmp"))


def test_atomic_writes_of_two_processes_never_share_a_temporary_file(tmp_path, monkeypatch):
    """Jobs on several GPUs may write the same file (a run folder's data cache) at once: each process writes its
    own temporary file, so the rename always puts one process's whole write in place."""
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: renamed.append((Path(src), Path(dst))) or real_replace(src, dst))
    save_atomic({"a": torch.ones(2)}, tmp_path / "x.pt")
    write_json(tmp_path / "x.json", {"a": 1})
    write_text_atomic(tmp_path / "x.txt", "a")
    assert [dst.name for _, dst in renamed] == ["x.pt", "x.json", "x.txt"]
    assert all(src == dst.with_name(f"{dst.name}.{os.getpid()}.tmp") for src, dst in renamed)
    other = subprocess.run([sys.executable, "-c", "from loglin_edu.provenance import temporary_path; "
                            f"print(temporary_path({str(tmp_path / 'x.pt')!r}))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(other) != temporary_path(tmp_path / "x.pt") and Path(other).parent == tmp_path


def test_batch_size_must_split_over_the_sets():
    with pytest.raises(ValueError, match="split evenly"):
        train(config(), MEMBERS, TRAIN, TEST, TrainConfig(steps=1, batch_size=5), progress=False)


@pytest.mark.slow
def test_cli_runs_the_cpu_tier_end_to_end(tmp_path):
    experiment_main(["--tier", "cpu", "--steps", "2", "--eval-every", "2", "--out", str(tmp_path), "--no-progress",
                     "--results", str(tmp_path / "results"), "--chunk-size", "4"])
    result = json.loads((tmp_path / "results" / "mqar_cpu.json").read_text())
    assert [j["model_name"] for j in result["jobs"]] == list(experiment.MODELS)
    assert len(result["best"]) == len(experiment.MODELS) and "gate" in result and "verdicts" in result
    assert result["command"].startswith("python -m loglin_edu.experiments.mqar --tier cpu")
    assert {"device", "commit", "date"} <= result.keys() and "torch" in result["versions"]
    for job in result["jobs"]:
        assert job["complete"] and job["parameters"]["total"] > job["parameters"]["embedding"] > 0
        assert (tmp_path / f"{job['name']}" / "checkpoint.pt").exists()
        if job["model_name"] != "transformer":  # the Transformer has no chunk
            assert job["model"]["mixer_options"]["chunk_size"] == 4


def test_tier_backend_reaches_the_layers():
    tier = replace(experiment.TIERS["cpu"], backend="auto")
    assert tier_from_dict(tier_to_dict(tier)) == tier
    assert experiment.model_config(tier, "loglinear_mamba2", 32).mixer_options["backend"] == "auto"
    kernels = replace(tier, backend="triton")  # the Triton kernels wherever a layer has one, "auto" elsewhere
    backends = {m: experiment.model_config(kernels, m, 32).mixer_options["backend"] for m in experiment.MODELS}
    assert backends == dict(transformer="torch", mamba2="triton", loglinear_mamba2="triton", gated_deltanet="triton",
                            loglinear_gated_deltanet="triton"), backends
    assert experiment.model_config(kernels, "loglinear_gated_deltanet_tied", 32).mixer_options["backend"] == "triton"
    with pytest.raises(ValueError, match="backend must be"):
        experiment.mixer_options("mamba2", 32, 8, "cuda")


def test_layer_backend_gives_the_kernels_to_layers_that_have_one():
    from loglin_edu.experiments.mqar.settings import mixer_options
    from loglin_edu.ops import layer_backend

    assert [layer_backend("triton", kernel) for kernel in (True, False)] == ["triton", "auto"]
    # every recurrent mixer has kernels; the Transformer runs its dense PyTorch form
    assert [mixer_options(model, 16, 16, "triton")["backend"] for model in
            ("mamba2", "loglinear_mamba2", "gated_deltanet", "loglinear_gated_deltanet", "transformer")] == \
        ["triton"] * 4 + ["torch"]
    assert [layer_backend(b, False) for b in ("auto", "torch")] == ["auto", "torch"]
    with pytest.raises(ValueError, match="backend must be one of"):
        layer_backend("cuda", True)


def final_line(seed, lr, validation, test):
    return dict(seed=seed, lr=lr, step=10, accuracy=test, query_accuracy=test, accuracy_by_set={"pairs=2": test},
                accuracy_by_level={"3": test}, validation=dict(accuracy=validation, query_accuracy=validation,
                                                                accuracy_by_set={"pairs=2": validation}))


def job_record(model, width, lines):
    members = [dict(seed=line["seed"], lr=line["lr"]) for line in lines]
    return dict(name=f"{model}-d{width}", model_name=model, width=width, members=members, final=lines, complete=True)


def test_validation_and_test_share_no_sequence_with_earlier_splits():
    """A tiny MQAR (T = 4, one pair, 8 tokens: 96 possible sequences) repeats itself: the held-out splits keep
    only sequences never seen in an earlier split; on the GPU tier's setting nothing is dropped."""
    spec = experiment.TaskSpec("mqar", seq_len=4, vocab_size=8, sizes=(1,), train_examples=40, validation_examples=30,
                               test_examples=30)
    train_sets, validation, test = experiment.make_sets(spec)
    seen = {tuple(row) for row in train_sets[0].inputs.tolist()}
    held = [tuple(row) for row in validation["pairs=1"].inputs.tolist()]
    assert len(set(held)) == len(held) and not seen & set(held)
    final = [tuple(row) for row in test["pairs=1"].inputs.tolist()]
    assert len(set(final)) == len(final) and not (seen | set(held)) & set(final)
    assert 0 < len(final) < 30 and 0 < len(held) < 30
    kept = validation["pairs=1"]
    assert torch.equal(kept.labels.gather(1, kept.query_positions), kept.answers)  # rows stay whole
    big = experiment.make_sets(replace(experiment.TIERS["gpu/mqar"].data, sizes=(4,), train_examples=500,
                                       validation_examples=100, test_examples=100))
    assert len(big[1]["pairs=4"]) == len(big[2]["pairs=4"]) == 100


def test_learning_rate_is_chosen_on_validation_not_test():
    """The test accuracy favours the rate 1e-2, the validation accuracy 1e-3: the validation decides, and a rate
    at the edge of a sweep of several is flagged."""
    lines = [final_line(0, 1e-3, validation=0.8, test=0.5), final_line(0, 1e-2, validation=0.6, test=0.9),
             final_line(0, 3e-3, validation=0.7, test=0.95)]
    [row] = experiment.best_by_cell([job_record("mamba2", 16, lines)])
    assert row["lr"] == 1e-3 and row["accuracy"] == 0.5 and row["validation_accuracy"] == 0.8 and row["edge"]
    middle = [final_line(0, 1e-3, 0.1, 0.1), final_line(0, 3e-3, 0.9, 0.9), final_line(0, 1e-2, 0.2, 0.2)]
    assert not experiment.best_by_cell([job_record("mamba2", 16, middle)])[0]["edge"]
    untested = [dict(line, validation=None) for line in lines]
    for line in untested:
        del line["validation"]
    with pytest.raises(ValueError, match="validation"):
        experiment.best_by_cell([job_record("mamba2", 16, untested)])


def result_with(accuracies, task="mqar"):
    """A results record whose chosen-rate table holds ``{(model, width): [accuracy per seed]}``."""
    best = [dict(model=m, width=w, seed=i, accuracy=a)
            for (m, w), accs in accuracies.items() for i, a in enumerate(accs)]
    result = dict(best=best, widths=sorted({w for _, w in accuracies}),
                  models=list(dict.fromkeys(m for m, _ in accuracies)), data=dict(task=task))
    result["gate"] = experiment.transformer_gate(result)
    return result


def test_gate_withholds_every_verdict_when_the_transformer_fails():
    cells = {("transformer", 16): [0.995, 0.999, 0.992], ("mamba2", 16): [0.40, 0.45, 0.42],
             ("loglinear_mamba2", 16): [0.60, 0.62, 0.58]}
    passed = result_with(cells)
    assert passed["gate"]["passed"] and passed["gate"]["by_width"]["16"] == pytest.approx(0.9953, abs=1e-4)
    [v] = experiment.verdicts(passed)
    assert v["verdict"] == "same direction" and v["paper"]["model"] == 55.9
    failed = result_with({**cells, ("transformer", 16): [0.995, 0.95, 0.999]})
    assert not failed["gate"]["passed"] and experiment.verdicts(failed) is None
    assert not result_with({k: v for k, v in cells.items() if k[0] != "transformer"})["gate"]["passed"]


@pytest.mark.parametrize("linear, loglinear, expected", [
    ([0.40, 0.45, 0.42], [0.60, 0.62, 0.58], "same direction"),
    ([0.60, 0.62, 0.58], [0.40, 0.45, 0.42], "contradicted"),
    ([0.40, 0.60, 0.50], [0.45, 0.62, 0.52], "not at this scale"),
    ([0.01, 0.02, 0.01], [0.03, 0.03, 0.04], "not at this scale"),
])
def test_verdicts_follow_the_seed_spread(linear, loglinear, expected):
    result = result_with({("transformer", 32): [1.0, 1.0, 1.0], ("mamba2", 32): linear,
                          ("loglinear_mamba2", 32): loglinear})
    assert experiment.verdict(result, "loglinear_mamba2", "mamba2", 32)["verdict"] == expected


def test_no_verdict_between_cells_trained_for_different_numbers_of_steps():
    result = result_with({("transformer", 32): [1.0, 1.0, 1.0], ("mamba2", 32): [0.40, 0.45, 0.42],
                          ("loglinear_mamba2", 32): [0.60, 0.62, 0.58]})
    for row in result["best"]:
        row["step"] = 1000 if row["model"] == "mamba2" else 1030
    close = experiment.verdict(result, "loglinear_mamba2", "mamba2", 32)
    assert close["equal_training"] and close["verdict"] == "same direction"
    for row in result["best"]:
        row["step"] = 800 if row["model"] == "mamba2" else 1000  # a deadline stopped one of them early
    far = experiment.verdict(result, "loglinear_mamba2", "mamba2", 32)
    assert not far["equal_training"] and far["verdict"] is None and far["steps"]["mamba2"] == [800]


def test_a_claim_with_a_missing_cell_says_nothing_about_equal_training():
    result = result_with({("transformer", 32): [1.0, 1.0, 1.0], ("mamba2", 32): [0.40, 0.45, 0.42]})
    missing = experiment.verdict(result, "loglinear_mamba2", "mamba2", 32)
    assert missing["equal_training"] is None and missing["verdict"] is None
    assert missing["steps"]["loglinear_mamba2"] == [] and missing["ours"]["seeds"] == (0, 3)


def test_training_scale_counts_steps_per_width():
    """Widths trained in different pieces can have different lengths: the scale says the steps of each width."""
    jobs = [dict(name=f"{m}-d{w}", width=w, steps_done=steps, complete=True)
            for w, steps in ((16, 650), (64, 2000)) for m in ("transformer", "mamba2")]
    result = dict(jobs=jobs, widths=[16, 64], train=dict(batch_size=60), seeds=[0, 1, 2], lrs=[1e-3], best=[])
    scale = experiment.training_scale(result)
    assert scale["steps_by_width"] == {16: 650, 64: 2000}
    assert (scale["steps_min"], scale["steps_max"], scale["sequences"]) == (650, 2000, 120_000)


def test_a_tie_at_the_top_is_judged_as_a_tie():
    both = {("transformer", 64): [1.0] * 3, ("gated_deltanet", 64): [0.995, 0.999, 0.993],
            ("loglinear_gated_deltanet", 64): [0.999, 0.998, 0.997]}
    assert experiment.verdict(result_with(both), "loglinear_gated_deltanet", "gated_deltanet", 64)["verdict"] == \
        "same direction"
    worse = {**both, ("loglinear_gated_deltanet", 64): [0.80, 0.82, 0.81]}
    assert experiment.verdict(result_with(worse), "loglinear_gated_deltanet", "gated_deltanet", 64)["verdict"] == \
        "contradicted"


def test_the_ablation_variants_tie_the_levels_of_their_log_linear_layers():
    tier = experiment.TIERS["gpu/mqar"]
    assert set(experiment.MODELS) < set(tier.models) and "loglinear_mamba2_tied" in tier.models
    config = experiment.model_config(tier, "loglinear_gated_deltanet_tied", 16)
    assert config.mixer == "loglinear_gated_deltanet" and config.mixer_options["tie_levels"]
    free = experiment.model_config(tier, "loglinear_gated_deltanet", 16)
    assert experiment.state_size(config) == experiment.state_size(free)
    with pytest.raises(ValueError, match="variant"):
        experiment.model_config(tier, "mamba2_tied", 16)
    result = dict(models=["mamba2", "loglinear_mamba2", "loglinear_mamba2_tied", "transformer"], widths=[16, 32])
    tied = "loglinear_mamba2_tied"
    assert experiment.claims(result) == [("loglinear_mamba2", "mamba2", 16), ("loglinear_mamba2", tied, 16),
                                         ("loglinear_mamba2", "mamba2", 32), ("loglinear_mamba2", tied, 32)]
    assert experiment.TIERS["gpu/lagged"].attention_rope and not tier.attention_rope  # lagged recall asks for recency


def test_compare_separates_only_beyond_the_seed_spread():
    def result(a, b):
        best = [dict(model="x", width=8, accuracy=v) for v in a] + [dict(model="y", width=8, accuracy=v) for v in b]
        return dict(best=best)

    clear = experiment.compare(result([0.9, 0.91, 0.92], [0.5, 0.52, 0.48]), "x", "y", 8)
    assert clear["separated"] and clear["better"] and clear["difference"] == pytest.approx(41.0)
    noisy = experiment.compare(result([0.9, 0.5, 0.7], [0.6, 0.8, 0.5]), "x", "y", 8)
    assert not noisy["separated"]
    assert noisy["standard_error"] == pytest.approx(math.sqrt(0.04 / 3 * 1e4 + 0.0233333 / 3 * 1e4), rel=1e-3)
    assert experiment.compare(result([0.9], [0.5, 0.6]), "x", "y", 8)["separated"] is None


def test_paper_table_covers_every_model_and_width():
    assert set(experiment.PAPER_MQAR) == set(experiment.MODELS)
    assert all(set(v) == {16, 32, 64} for v in experiment.PAPER_MQAR.values())


TINY = experiment.Tier(
    data=experiment.TaskSpec("mqar", seq_len=16, vocab_size=32, sizes=(2, 4), train_examples=64, validation_examples=16,
                             test_examples=16),
    models=("transformer", "loglinear_mamba2"), widths=(16,), seeds=(0,), lrs=(3e-3, 1e-2), chunk_size=4,
    train=TrainConfig(steps=6, batch_size=8, warmup_steps=2, eval_every=3, checkpoint_every=3, eval_batch_size=16),
)


def job_state(folder):
    """What a job left in its folder: its results file (without wall-clock times) and its weights."""
    record = json.loads((folder / "record.json").read_text())
    for line in record["history"] + record["final"]:
        line.pop("seconds")
    for key in ("seconds", "seconds_per_step"):
        record.pop(key)
    return record, weights(folder)


def test_a_resumed_job_equals_an_uninterrupted_one(tmp_path):
    """A job stopped after step 4 (its results file then holds the evaluation of step 3) and started again writes
    the results file and weights of a job that never stopped."""
    sets = experiment.make_sets(TINY.data)
    experiment.run_job(TINY, "loglinear_mamba2", 16, out_dir=tmp_path / "a", device="cpu", progress=False, sets=sets)
    experiment.run_job(TINY, "loglinear_mamba2", 16, out_dir=tmp_path / "b", device="cpu", progress=False, sets=sets,
                       stop_at=4)
    stopped = json.loads((tmp_path / "b" / "record.json").read_text())
    assert not stopped["complete"] and [h["step"] for h in stopped["history"]] == [3, 3]
    assert "accuracy" not in stopped["history"][0]  # the test sets are read at the end only
    assert "validation" in stopped["history"][0]
    experiment.run_job(TINY, "loglinear_mamba2", 16, out_dir=tmp_path / "b", device="cpu", progress=False, sets=sets)
    (record_a, weights_a), (record_b, weights_b) = job_state(tmp_path / "a"), job_state(tmp_path / "b")
    assert record_b["complete"] and record_a == record_b
    assert "accuracy" in record_b["final"][0] and "level_scales" in record_b["final"][0]
    for a, b in zip(weights_a, weights_b):
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_plan_shares_the_seconds_left_by_the_summed_step_times():
    from loglin_edu.experiments.mqar.jobs import plan_steps

    assert plan_steps({"a": 0.01, "b": 0.03}, fixed_seconds=0.0, seconds_left=100.0, cap=10**6, floor=50) == 1870
    assert plan_steps({"a": 0.01, "b": 0.03}, fixed_seconds=60.0, seconds_left=100.0, cap=10**6, floor=50) == 750
    assert plan_steps({"a": 1.0}, fixed_seconds=0.0, seconds_left=10.0, cap=10**6, floor=50) == 50
    assert plan_steps({"a": 1e-4}, fixed_seconds=0.0, seconds_left=100.0, cap=4000, floor=50) == 4000


@pytest.mark.slow
def test_a_piece_of_worker_processes_plans_trains_and_merges(tmp_path):
    """A piece with a budget runs each job in its own process: the jobs report their step time, get one total,
    finish it and write their results files; the merge makes one file with a record per tier. A second piece on
    the same folder keeps the plan and finds nothing left to do."""
    from loglin_edu.experiments.mqar.jobs import job_folder

    tier = replace(TINY, train=replace(TINY.train, steps=400, warmup_steps=60, eval_every=100, checkpoint_every=None))
    experiment.run_piece({"gpu/mqar": tier}, tmp_path, "cpu", budget_s=240)
    plans = [json.loads((job_folder(tmp_path, ("gpu/mqar", m, 16)) / "plan.json").read_text()) for m in tier.models]
    assert len({p["steps"] for p in plans}) == 1 and 70 <= plans[0]["steps"] <= 400
    merged = experiment.merge({"gpu/mqar": tier}, tmp_path, device="cpu")
    result = merged["tiers"]["gpu/mqar"]
    assert [j["steps_done"] for j in result["jobs"]] == [plans[0]["steps"]] * 2
    assert all(j["complete"] and j["plan"] for j in result["jobs"]) and len(result["best"]) == 2
    assert {"commit", "date", "versions"} <= merged.keys() and "gate" in result
    named = experiment.merge({"gpu/mqar": tier}, tmp_path, device="cpu", commit="abc123")  # --commit names the code
    assert named["commit"] == "abc123"
    experiment.run_piece({"gpu/mqar": tier}, tmp_path, "cpu", budget_s=240)
    again = experiment.merge({"gpu/mqar": tier}, tmp_path, device="cpu")["tiers"]["gpu/mqar"]
    assert [j["steps_done"] for j in again["jobs"]] == [plans[0]["steps"]] * 2


def test_merge_keeps_the_tiers_merged_before(tmp_path, monkeypatch):
    """A second task merged later (another piece, another machine) joins the tiers already in the results file;
    the tiers merged now replace their older versions."""
    from loglin_edu.experiments.mqar import __main__ as cli

    earlier = dict(what="x", tiers={"gpu/lagged": dict(tier="gpu/lagged", old=True), "gpu/mqar": dict(old=True)})
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / cli.MERGED).write_text(json.dumps(earlier))
    monkeypatch.setattr(cli, "merge", lambda tiers, out, **kw: dict(what="y", tiers={"gpu/mqar": dict(old=False)}))
    monkeypatch.setattr(cli, "summary_table", lambda result: [])
    cli.main(["--tier", "gpu", "--task", "mqar", "--merge", "--out", str(tmp_path / "run"), "--results",
              str(tmp_path / "results"), "--device", "cpu"])
    merged = json.loads((tmp_path / "results" / cli.MERGED).read_text())
    assert merged["what"] == "y" and merged["tiers"] == {"gpu/lagged": dict(tier="gpu/lagged", old=True),
                                                        "gpu/mqar": dict(old=False)}


def test_a_merge_names_the_machine_the_jobs_trained_on(tmp_path):
    """Each job records its device, commit and versions; a merge elsewhere keeps them as the tier's and names the
    merging machine apart; fields the jobs disagree on fall back to the merging process's."""
    from loglin_edu.experiments.mqar.report import results_record, training_machine
    from loglin_edu.provenance import device_name

    record = experiment.run_job(TINY, "transformer", 16, out_dir=tmp_path / "a", device="cpu", progress=False)
    assert record["trained_on"]["device"] == device_name("cpu")
    assert json.loads((tmp_path / "a" / "record.json").read_text())["trained_on"] == record["trained_on"]
    elsewhere = dict(device="NVIDIA H200", commit="abc", versions={"torch": "2.11"})
    jobs = [{**record, "trained_on": elsewhere},
            {**record, "name": "second", "trained_on": {**elsewhere, "commit": "def"}}]
    assert training_machine(jobs) == dict(device="NVIDIA H200", versions={"torch": "2.11"})
    assert training_machine([*jobs, record | {"trained_on": None}]) == {}
    newer = {**elsewhere, "versions": {"torch": "2.11", "fla-core": "0.6.0"}}
    assert training_machine([jobs[0], {**record, "trained_on": newer}])["versions"] == {"torch": "2.11"}
    merged = results_record("cpu", TINY, jobs, device="cpu", seconds=1.0, commit=None, command="merge")
    assert merged["device"] == "NVIDIA H200" and merged["merged_on"] == device_name("cpu")
    assert merged["versions"] == {"torch": "2.11"} and merged["commit"] not in ("abc", "def")
    assert sorted(merged["trained_commits"].values()) == ["abc", "def"]
    not_run = dict(name="later", model_name="mamba2", width=16, members=[], history=[], final=[], complete=False,
                   steps_done=0, not_run=True)
    partial = results_record("cpu", TINY, [jobs[0], not_run], device="cpu", seconds=1.0, commit=None, command="merge")
    assert partial["device"] == "NVIDIA H200" and partial["commit"] == "abc" and "trained_commits" not in partial
    here = results_record("cpu", TINY, [record], device="cpu", seconds=1.0, commit=None, command="merge")
    assert here["device"] == device_name("cpu") and "merged_on" not in here


def test_a_merge_takes_the_jobs_its_folder_lacks_from_earlier_merged_files(tmp_path):
    """Jobs merged before (another machine, a run folder since removed) join the jobs of the run folder: the
    folder's record wins where both have one, and the merged file equals one made from a folder holding all."""
    from loglin_edu.experiments.mqar.jobs import job_folder

    tier = replace(TINY, models=("transformer", "mamba2"))
    for model in tier.models:
        experiment.run_job(tier, model, 16, out_dir=job_folder(tmp_path / "all", ("gpu/mqar", model, 16)),
                           device="cpu", progress=False)
    everything = experiment.merge({"gpu/mqar": tier}, tmp_path / "all", device="cpu")
    (tmp_path / "merged.json").write_text(json.dumps(everything))
    only_mamba = tmp_path / "part"
    shutil.copytree(job_folder(tmp_path / "all", ("gpu/mqar", "mamba2", 16)),
                    job_folder(only_mamba, ("gpu/mqar", "mamba2", 16)))
    alone = experiment.merge({"gpu/mqar": tier}, only_mamba, device="cpu")["tiers"]["gpu/mqar"]
    assert [j["complete"] for j in alone["jobs"]] == [False, True] and not alone["gate"]["passed"]
    assert alone["jobs"][0]["not_run"] and "error" not in alone["jobs"][0]
    assert experiment.training_scale(alone)["incomplete"] == []  # not started is not stopped early
    joined = experiment.merge({"gpu/mqar": tier}, only_mamba, device="cpu",
                              include=[tmp_path / "merged.json"])["tiers"]["gpu/mqar"]
    assert joined["jobs"] == everything["tiers"]["gpu/mqar"]["jobs"]
    assert joined["best"] == everything["tiers"]["gpu/mqar"]["best"]
    record = job_folder(only_mamba, ("gpu/mqar", "mamba2", 16)) / "record.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "seconds": 123.0}))
    again = experiment.merge({"gpu/mqar": tier}, only_mamba, device="cpu",
                             include=[tmp_path / "merged.json"])["tiers"]["gpu/mqar"]
    assert [j["seconds"] for j in again["jobs"]] == [everything["tiers"]["gpu/mqar"]["jobs"][0]["seconds"], 123.0]


def test_a_cells_seeds_trained_as_separate_jobs_merge_into_one_cell(tmp_path):
    """Jobs of some seeds each (folders ``model-dWIDTH-sSEEDS``) merge into the cell one job of all seeds gives:
    the same chosen rates, accuracies and validation curve (a member's batches depend on its seed alone); a seed
    from an earlier merged file joins them; a seed trained by two jobs of the folder is refused."""
    from loglin_edu.experiments.mqar.jobs import grid, job_folder

    tier = replace(TINY, models=("transformer",), seeds=(0, 1))
    assert grid({"gpu/mqar": replace(tier, seeds=(1,))}, by_seeds=True) == [("gpu/mqar", "transformer", 16, (1,))]
    assert job_folder(tmp_path, ("gpu/mqar", "transformer", 16, (0, 1))).name == "transformer-d16-s0-1"
    experiment.run_job(tier, "transformer", 16, out_dir=job_folder(tmp_path / "all", ("gpu/mqar", "transformer", 16)),
                       device="cpu", progress=False)
    for seed in tier.seeds:
        folder = job_folder(tmp_path / "apart", ("gpu/mqar", "transformer", 16, (seed,)))
        experiment.run_job(replace(tier, seeds=(seed,)), "transformer", 16, device="cpu", progress=False,
                           out_dir=folder, name=folder.name)
    together = experiment.merge({"gpu/mqar": tier}, tmp_path / "all", device="cpu")["tiers"]["gpu/mqar"]
    apart = experiment.merge({"gpu/mqar": tier}, tmp_path / "apart", device="cpu")
    cell = apart["tiers"]["gpu/mqar"]
    assert [j["name"] for j in cell["jobs"]] == ["transformer-d16-s0", "transformer-d16-s1"]
    key = lambda r: (r["seed"], r["lr"], r["step"])  # noqa: E731
    assert [key(r) for r in cell["best"]] == [key(r) for r in together["best"]]
    for a, b in zip(cell["best"], together["best"]):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-6)
    steps, curve = experiment.validation_curve(cell, "transformer", 16)
    assert steps == experiment.validation_curve(together, "transformer", 16)[0] and len(steps) > 1
    assert curve == pytest.approx(experiment.validation_curve(together, "transformer", 16)[1], abs=1e-4)
    (tmp_path / "merged.json").write_text(json.dumps(apart))
    shutil.rmtree(job_folder(tmp_path / "apart", ("gpu/mqar", "transformer", 16, (0,))))
    joined = experiment.merge({"gpu/mqar": tier}, tmp_path / "apart", device="cpu",
                              include=[tmp_path / "merged.json"])["tiers"]["gpu/mqar"]
    assert [j["name"] for j in joined["jobs"]] == ["transformer-d16-s1", "transformer-d16-s0"]
    assert [key(r) for r in joined["best"]] == [key(cell["best"][1]), key(cell["best"][0])]
    shutil.copytree(job_folder(tmp_path / "all", ("gpu/mqar", "transformer", 16)),
                    job_folder(tmp_path / "apart", ("gpu/mqar", "transformer", 16, (0, 1))))
    with pytest.raises(ValueError, match=r"seeds \[1\] of transformer-d16 were trained by two jobs"):
        experiment.merge({"gpu/mqar": tier}, tmp_path / "apart", device="cpu")

def test_fixed_totals_are_written_once_and_kept(tmp_path):
    """A piece given fixed totals writes each job's total into its plan; the same total again is accepted, and a job
    planned for another total is refused (its learning-rate schedule depends on the total)."""
    from loglin_edu.experiments.mqar.jobs import fix_totals, job_folder

    todo = [("gpu/mqar", m, 16) for m in TINY.models]
    for job in todo:
        job_folder(tmp_path, job).mkdir(parents=True)
    fix_totals({"gpu/mqar": TINY}, tmp_path, todo)
    plans = [json.loads((job_folder(tmp_path, job) / "plan.json").read_text()) for job in todo]
    assert [p["steps"] for p in plans] == [TINY.train.steps] * len(todo) and all(p["fixed"] for p in plans)
    fix_totals({"gpu/mqar": TINY}, tmp_path, todo)
    longer = replace(TINY, train=replace(TINY.train, steps=TINY.train.steps + 1))
    with pytest.raises(ValueError, match=f"planned for {TINY.train.steps} steps"):
        fix_totals({"gpu/mqar": longer}, tmp_path, todo)


def test_the_command_line_fixes_totals_only_when_given_steps(tmp_path, monkeypatch):
    """``--steps`` means a fixed total even with a budget (the budget then sets only the deadline)."""
    from loglin_edu.experiments.mqar import __main__ as cli

    calls = []
    monkeypatch.setattr(cli, "run_piece", lambda tiers, out, device, **kw: calls.append((tiers, kw)) or [])
    base = ["--tier", "gpu", "--task", "mqar", "--widths", "16", "--out", str(tmp_path), "--device", "cpu",
            "--budget-s", "100"]
    cli.main(base + ["--steps", "7000"])
    cli.main(base)
    cli.main(base + ["--seeds", "2"])
    (fixed_tiers, fixed), (_, planned), (seed_tiers, by_seed) = calls
    assert fixed["fixed"] and fixed_tiers["gpu/mqar"].train.steps == 7000 and fixed["budget_s"] == 100
    assert not planned["fixed"] and not planned["by_seeds"] and not fixed["by_seeds"]
    assert by_seed["by_seeds"] and seed_tiers["gpu/mqar"].seeds == (2,)
    with pytest.raises(SystemExit):
        cli.main(base + ["--merge", "--seeds", "2"])


def test_a_step_mode_from_the_benchmark_reaches_lambda_tied_jobs(tmp_path, monkeypatch):
    """``--mode-from`` gives every job the chosen mode, the λ-tied variants too (run_piece looks a tied job's mode
    up under its model's name)."""
    from loglin_edu.experiments.mqar import __main__ as cli
    from loglin_edu.experiments.mqar.settings import base_model

    bench = tmp_path / "step_time.json"
    rows = [dict(model=m, mode="compiled+graphs", ms_per_step=1.0, seconds_to_first_step=1.0, capture_error=None)
            for m in ("loglinear_mamba2", "loglinear_gated_deltanet")]
    bench.write_text(json.dumps(dict(modes=["compiled+graphs"], rows=rows)))
    calls = []
    monkeypatch.setattr(cli, "run_piece", lambda tiers, out, device, **kw: calls.append((tiers, kw)) or [])
    cli.main(["--tier", "gpu", "--task", "mqar", "--widths", "16", "--out", str(tmp_path / "run"), "--device", "cpu",
              "--budget-s", "100", "--mode-from", str(bench),
              "--models", "loglinear_mamba2_tied,loglinear_gated_deltanet_tied"])
    (tiers, kw), = calls
    models = tiers["gpu/mqar"].models
    assert set(models) == {"loglinear_mamba2_tied", "loglinear_gated_deltanet_tied"}
    assert all(kw["modes"].get(base_model(m)) == "compiled+graphs" for m in models)


def test_the_zoology_hybrid_transformer_is_the_mqar_tiers_and_an_option_of_the_others(tmp_path, monkeypatch):
    """``attention_hybrid`` (``--attention-hybrid`` / ``--no-attention-hybrid``) gives the Transformer, and only
    it, a gated convolution layer of the tier's convolution width before an attention layer without one; the MQAR
    tier has it on, lagged recall off; it survives the worker's round trip and is recorded in the results."""
    from loglin_edu.experiments.mqar import __main__ as cli

    tier = experiment.TIERS["gpu/mqar"]
    assert tier.attention_hybrid and not experiment.TIERS["gpu/lagged"].attention_hybrid
    hybrid = experiment.model_config(tier, "transformer", 16)
    assert hybrid.hybrid_conv == 3 and hybrid.mixer_options["conv_size"] == 0
    assert experiment.model_config(tier, "mamba2", 16).hybrid_conv == 0
    plain = experiment.model_config(replace(tier, attention_hybrid=False), "transformer", 16)
    assert plain.hybrid_conv == 0 and plain.mixer_options["conv_size"] == 3
    assert tier_from_dict(tier_to_dict(tier)).attention_hybrid
    assert not tier_from_dict(tier_to_dict(replace(tier, attention_hybrid=False))).attention_hybrid
    calls = []
    monkeypatch.setattr(cli, "run_piece", lambda tiers, out, device, **kw: calls.append(tiers) or [])
    base = ["--tier", "gpu", "--task", "mqar", "--widths", "16", "--out", str(tmp_path), "--device", "cpu"]
    cli.main(base)
    cli.main(base + ["--no-attention-hybrid"])
    cli.main(base[:3] + ["lagged"] + base[4:] + ["--attention-hybrid"])
    assert calls[0]["gpu/mqar"].attention_hybrid and not calls[1]["gpu/mqar"].attention_hybrid
    assert calls[2]["gpu/lagged"].attention_hybrid
    record = experiment.results_record("gpu/mqar", tier, [], device="cpu", seconds=0.0, commit=None, command=None)
    assert record["transformer"] == dict(conv_size=3, rope=False, hybrid=True)
    assert experiment.describe_transformer(record["transformer"]).startswith("a gated convolution layer, then attention")
    assert experiment.describe_transformer(experiment.transformer_layout(experiment.TIERS["gpu/lagged"])) == (
        "a convolution of width 3 before attention in each layer, RoPE")


def test_a_checkpointed_optimiser_follows_the_resuming_runs_form():
    """An optimiser state saved by the ``foreach`` AdamW (the CPU's) and loaded where the update is the fused one
    (CUDA's) takes the run's form, keeps its moments and step counts, and goes on updating as the saved form would,
    to rounding. (PyTorch's fused AdamW runs on the CPU too, which lets this be checked here.)"""
    import copy

    from loglin_edu.train import make_optimizer
    from loglin_edu.train.loop import follow_step_mode

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    optimizer = make_optimizer([model], [1e-2], weight_decay=0.1)
    assert all(g["foreach"] and not g["fused"] for g in optimizer.param_groups)

    def step(m, opt, seed):
        torch.manual_seed(seed)
        opt.zero_grad()
        m(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()

    for seed in range(3):
        step(model, optimizer, seed)
    resumed_model = copy.deepcopy(model)
    resumed = make_optimizer([resumed_model], [1e-2], weight_decay=0.1)
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    follow_step_mode(resumed, capturable=False, fused=True)
    assert all(g["fused"] and not g["foreach"] for g in resumed.param_groups)
    assert [resumed.state[p]["step"].item() for p in resumed_model.parameters()] == [3.0] * 4
    for seed in range(3, 6):
        step(model, optimizer, seed)
        step(resumed_model, resumed, seed)
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
