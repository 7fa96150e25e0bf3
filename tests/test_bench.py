"""The benchmark's bookkeeping: per-kernel work adds up to the schedule's counted work; the profile's table."""

import functools
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from loglin_edu.bench.profile import PROFILED, compiled_kernels, config_of, delta_kernel_work, kernel_work, profile_lengths
from loglin_edu.bench.settings import CPU, GDN_CPU, GDN_GPU, GPU, carried_levels, counted_work


@pytest.mark.parametrize("setting, T", [(GPU, 1024), (GPU, 65536), (GPU, 3000), (CPU, 32), (GDN_GPU, 1024),
                                        (GDN_GPU, 65536), (GDN_GPU, 3000), (GDN_CPU, 32)])
def test_kernel_work_adds_up_to_the_counted_work(setting, T):
    B = setting.tokens // T
    work = counted_work(B, T, setting)
    assert sum(kernel_work(B, T, setting).values()) == work["forward_flops"] + work["backward_flops"]


@pytest.mark.parametrize("N", [1, 2, 3, 8, 17, 1024])
def test_the_stacked_walk_carries_one_level_per_set_bit_of_the_next_chunk(N):
    """Chunk ``c`` hands chunk ``c + 1`` one state per set bit of ``c + 1``; all but the chunk's own write (when ``c``
    is even, the lowest, which starts from nothing) are transitions of a state."""
    assert carried_levels(N) == sum(bin(c + 1).count("1") - (c % 2 == 0) for c in range(N - 1))
    assert carried_levels(8) == 8


def fake_kernel(name, n_regs, n_spills, in_metadata=False):
    """An object shaped like triton's ``CompiledKernel``: registers as its attributes, or only in its metadata."""
    meta = SimpleNamespace(name=name, num_warps=8, num_stages=1, shared=1024)
    if in_metadata:
        meta.n_regs, meta.n_spills = n_regs, n_spills
        return SimpleNamespace(metadata=meta)
    return SimpleNamespace(metadata=meta, name=name, n_regs=n_regs, n_spills=n_spills)


def test_compiled_kernels_reads_both_cache_layouts():
    """Five-entry device caches (kernels, keys, target, backend, binder) with registers on the kernel, and
    four-entry ones with registers in the metadata; a kernel cached twice is listed once; other names ignored."""
    shared = fake_kernel("level_read_grad_kernel", 231, 0)
    first = SimpleNamespace(device_caches={0: ({"a": fake_kernel("level_write_grad_kernel", 238, 0),
                                                "b": fake_kernel("level_write_grad_kernel", 255, 12)}, {}, None, None,
                                               None)})
    second = SimpleNamespace(device_caches={0: ({"c": fake_kernel("delta_chunk_kernel", 200, 3, in_metadata=True),
                                                 "d": shared}, None, None, None),
                                            1: ({"d": shared}, None, None, None)})
    module = SimpleNamespace(first=first, second=second, helper=lambda: None, number=3)
    rows = compiled_kernels([module])
    assert [(r["kernel"], r["n_regs"], r["n_spills"]) for r in rows] == [
        ("delta_chunk_kernel", 200, 3), ("level_read_grad_kernel", 231, 0), ("level_write_grad_kernel", 255, 12),
        ("level_write_grad_kernel", 238, 0)]
    assert all(r["num_warps"] == 8 and r["shared"] == 1024 for r in rows)


def test_profile_table_splits_the_phases_and_adds_work_and_registers():
    """profile_lengths with a stand-in for the device timer (the first call times the forwards, each later one a
    backward) and for the compiled-kernel table: per-step times by phase, counted flops, the largest registers."""
    calls = []

    def times(run):
        run()
        calls.append(run)
        if len(calls) == 1:
            return {"delta_chunk_kernel": [2, 4.0], "aten::copy_": [6, 0.6], "block_delta_chunk_kernel": [1, 0.5]}
        return {"delta_chunk_solve_bwd_kernel": [1, 3.0], "slot_gram_kernel": [1, 1.0]}

    def compiled():
        return [dict(kernel="slot_gram_kernel", n_regs=238, n_spills=0),
                dict(kernel="slot_gram_kernel", n_regs=255, n_spills=40),
                dict(kernel="delta_chunk_kernel", n_regs=None, n_spills=None)]

    s = replace(GDN_CPU, tokens=16)
    [profiled] = profile_lengths(s, [16], "loglinear gated deltanet (torch chunkwise)", steps=2, device="cpu",
                                 times=times, compiled=compiled)
    assert len(calls) == 3  # the forwards, then one backward per step
    rows = {(r["phase"], r["kernel"]): r for r in profiled["kernels"]}
    assert set(rows) == {("forward", "delta_chunk_kernel"), ("forward", "aten::copy_"), ("forward", "block_delta_chunk_kernel"),
                         ("backward", "delta_chunk_solve_bwd_kernel"), ("backward", "slot_gram_kernel")}
    assert rows["forward", "delta_chunk_kernel"]["ms"] == 2.0 and rows["forward", "delta_chunk_kernel"]["calls"] == 1
    assert rows["backward", "delta_chunk_solve_bwd_kernel"]["ms"] == 3.0
    assert rows["backward", "slot_gram_kernel"]["calls"] == 1
    assert profiled["forward_ms"] == pytest.approx(2.55) and profiled["backward_ms"] == pytest.approx(4.0)
    assert profiled["total_ms"] == pytest.approx(6.55) and profiled["B"] == 1
    work = delta_kernel_work(1, 16, s)
    assert rows["backward", "slot_gram_kernel"]["flops"] == work["slot_gram_kernel"]
    assert "flops" not in rows["forward", "aten::copy_"]
    assert "flops" not in rows["forward", "block_delta_chunk_kernel"]  # another kernel: its name only contains one
    assert rows["backward", "slot_gram_kernel"]["n_regs"] == 255
    assert rows["backward", "slot_gram_kernel"]["n_spills"] == 40
    assert "n_regs" not in rows["forward", "delta_chunk_kernel"]
    assert [r["phase"] for r in profiled["kernels"]] == ["forward"] * 3 + ["backward"] * 2
    assert profiled["kernels"][3]["kernel"] == "delta_chunk_solve_bwd_kernel"  # largest first within the phase


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_profile_refuses_without_a_gpu():
    from loglin_edu.bench.profile import main

    with pytest.raises(SystemExit):
        main(["--model", "gated_deltanet", "--lengths", "16"])


def test_launch_configurations_from_the_command_line():
    from loglin_edu.bench.profile import model_launch_config
    from loglin_edu.kernels.config import LaunchConfig

    launch_config = functools.partial(model_launch_config, "loglinear_mamba2")

    assert launch_config("8,3,4,8") == LaunchConfig(head_group=8, block_levels=3, num_warps=4, tree_warps=8)
    assert launch_config("tree_registers=true, tree_key_split=2,tree_block_levels=none,precision=exact") == LaunchConfig(
        tree_registers=True, tree_key_split=2, tree_block_levels=None, precision="exact")
    assert launch_config("tree_key_split=2,decay_sums_in_kernels=true,fused_grads=true") == LaunchConfig(
        tree_key_split=2, decay_sums_in_kernels=True, fused_grads=True)
    with pytest.raises(ValueError, match="head_group,block_levels,num_warps,tree_warps \\(integers\\) or field=value"):
        launch_config("8,3")
    with pytest.raises(ValueError, match="LaunchConfig has no field no_such_field"):
        launch_config("no_such_field=1")
    with pytest.raises(ValueError, match="or field=value pairs, got 'a=1,b'"):
        launch_config("a=1,b")


def test_every_kind_of_launch_configuration_from_the_command_line():
    from loglin_edu.bench.measure import config_from_spec
    from loglin_edu.kernels.config import DeltaLaunchConfig, LinearLaunchConfig

    assert config_from_spec("8,32,4,2", LinearLaunchConfig) == LinearLaunchConfig(8, 32, 4, 2)
    assert config_from_spec("num_stages=1", LinearLaunchConfig) == LinearLaunchConfig(num_stages=1)
    assert config_from_spec("32,32,4,8,1", DeltaLaunchConfig) == DeltaLaunchConfig(
        value_tile=32, grad_value_tile=32, walk_warps=4, grad_warps=8, num_stages=1)
    with pytest.raises(ValueError, match="block_chunks,key_split,num_warps,num_stages"):
        config_from_spec("1,16", LinearLaunchConfig)


def test_the_cli_refuses_launch_options_without_variants(capsys):
    from loglin_edu.bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["--tier", "cpu", "--linear"])
    assert "--linear goes with --variants" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--tier", "cpu", "--configs", "value_tile=16"])
    assert "--configs goes with --variants or --accuracy" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--tier", "cpu", "--dtypes", "float16"])
    assert "--shapes and --dtypes go with --accuracy" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--tier", "cpu", "--accuracy", "--shapes", "1,20,1,1,16"])
    assert "a shape is B,T,H,Hk,K,V (six positive integers), got '1,20,1,1,16'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--tier", "cpu", "--variants", "--linear", "--configs", "1,16"])
    assert "--configs: a launch configuration is block_chunks,key_split" in capsys.readouterr().err


def test_a_profiled_launch_configuration_goes_to_our_log_linear_kernel_only():
    """``--config`` configures our log-linear kernel; the linear rungs profiled beside it keep their own launches."""
    from loglin_edu.kernels.config import LaunchConfig

    config = LaunchConfig(tree_key_split=2)
    given = {name: config_of(name, "loglinear_mamba2", config) for name in PROFILED["loglinear_mamba2"]}
    assert given == {"loglinear (ours, triton)": config, "mamba2 linear (ours, triton step 1)": None,
                     "mamba2 linear (ours, triton chunk-parallel)": None}


def test_variants_save_every_row_as_it_is_measured(tmp_path, monkeypatch):
    """A variants run stopped midway (a timeout) leaves the rows it measured in its results file, marked incomplete."""
    import json

    from loglin_edu.bench import measure
    from loglin_edu.bench.__main__ import main

    def measured_once(name, inputs, device, fn):
        if measured_once.calls:
            raise KeyboardInterrupt  # what a stopping run raises
        measured_once.calls += 1
        return {"name": name, "forward_ms": 1.0, "forward_backward_ms": 3.0}

    measured_once.calls = 0
    monkeypatch.setattr(measure, "measure", measured_once)
    out = tmp_path / "v.json"
    with pytest.raises(KeyboardInterrupt):
        main(["--tier", "cpu", "--model", "gated_deltanet", "--variants", "--lengths", "16", "--configs",
              "value_tile=16", "value_tile=32", "--quiet", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["complete"] is False
    [row] = saved["variants"]
    assert (row["T"], row["config"]["value_tile"], row["forward_backward_ms"]) == (16, 16, 3.0)


def test_accuracy_runs_each_launch_configuration_and_saves_every_case(tmp_path, monkeypatch):
    """``--accuracy --configs``: every shape under every configuration and dtype asked for, each case saved with
    its configuration as it is measured; a run stopped midway keeps its cases, marked incomplete."""
    import json

    from loglin_edu.bench import __main__ as cli
    from loglin_edu.kernels.config import DeltaLaunchConfig

    measured = []

    def errors_once(shape, dtype, device, config=None):
        if len(measured) == 2:
            raise KeyboardInterrupt
        measured.append((shape, dtype, config))
        return {"shape": shape, "dtype": str(dtype), "errors": {"o": 1e-3}}

    monkeypatch.setattr(cli, "delta_accuracy", errors_once)
    out = tmp_path / "a.json"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--tier", "cpu", "--model", "gated_deltanet", "--accuracy", "--shapes", "1,20,1,1,16,16",
                  "--dtypes", "bfloat16", "float16", "--configs", "factor_dtype=float32", "factor_dtype=float16",
                  "--out", str(out)])
    assert measured == [((1, 20, 1, 1, 16, 16), torch.bfloat16, DeltaLaunchConfig(factor_dtype="float32")),
                        ((1, 20, 1, 1, 16, 16), torch.float16, DeltaLaunchConfig(factor_dtype="float32"))]
    saved = json.loads(out.read_text())
    assert saved["complete"] is False and len(saved["accuracy"]) == 2
    assert {case["config"]["factor_dtype"] for case in saved["accuracy"]} == {"float32"}


def test_the_profile_takes_a_launch_configuration_of_either_model():
    from loglin_edu.bench.profile import model_launch_config
    from loglin_edu.kernels.config import DeltaLaunchConfig, LaunchConfig

    assert model_launch_config("gated_deltanet", "adjoint_value_tile=16") == DeltaLaunchConfig(adjoint_value_tile=16)
    assert model_launch_config("loglinear_mamba2", "tree_key_split=2") == LaunchConfig(tree_key_split=2)
    assert model_launch_config("gated_deltanet", None) == DeltaLaunchConfig()
    with pytest.raises(ValueError, match="adjoint_value_tile"):
        model_launch_config("loglinear_mamba2", "adjoint_value_tile=16")
