"""The decode benchmark's CPU tier: every implementation measured (the kernel's variants each as their own
row), state bytes as the caches say, bytes moved as counted, results written with their provenance."""

import json

import pytest

pytest.importorskip("triton")


def test_decode_benchmark_cpu_tier(tmp_path):
    from loglin_edu.bench.decode import CPU, IMPLEMENTATIONS, KERNEL_VARIANTS, main
    from loglin_edu.kernels.decode_step import default_schedule

    out = tmp_path / "decode.json"
    result = main(["--tier", "cpu", "--quiet", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["complete"] and saved["rows"] == result["rows"]
    for key in ("command", "commit", "date", "device", "versions", "setting", "goals"):
        assert key in saved, key
    rows = {(r["name"], r["batch"], r["context"]): r for r in saved["rows"]}
    assert len(rows) == len(IMPLEMENTATIONS) * len(CPU.batches) * len(CPU.contexts)
    assert all("step_ms" in r and r["step_ms"] > 0 for r in rows.values()), [r for r in rows.values() if "step_ms" not in r]
    state = CPU.heads * CPU.key * CPU.value * 4  # one fp32 K × V state per head
    for B in CPU.batches:
        for T in CPU.contexts:
            L = (T - 1).bit_length()  # the buffer's slots: levels 1..L of the next query
            scales = B * CPU.heads * L * CPU.value * 4  # the lazy layout's decay scales
            for name, (_, lazy) in [*KERNEL_VARIANTS.items(), ("loglinear_torch", (None, True))]:
                assert rows[(name, B, T)]["state_bytes"] == B * (L * state + 8) + lazy * scales, name
                assert rows[(name, B, T)]["levels"] == L, name
            assert rows[("loglinear", B, T)]["live_levels_before"] == [
                lvl for lvl in range(1, L + 1) if (T - 1) >> (lvl - 1) & 1]
            for name in KERNEL_VARIANTS:
                assert rows[(name, B, T)]["live_levels_before"] == rows[("loglinear", B, T)]["live_levels_before"]
            p = bin(T - 1).count("1")  # live levels before the step
            target = int(T & (T - 1) != 0)  # the carry of token T - 1 fills level j + 1, 2^j = T & -T, if it is in
            eager = B * (2 * p + target) * state
            lazy = B * ((p + target) * state + (2 * p + target) * CPU.heads * CPU.value * 4)
            for name, (_, is_lazy) in KERNEL_VARIANTS.items():
                assert rows[(name, B, T)]["moved_bytes"] == (lazy if is_lazy else eager), name
            assert rows[("loglinear", B, T)]["schedule"] == default_schedule(B, CPU.heads)
            assert rows[("mamba2", B, T)]["state_bytes"] == B * state
            assert rows[("attention", B, T)]["state_bytes"] == 2 * B * CPU.heads * T * CPU.value * 4
    cells = {f"B={B},T={T}" for B in CPU.batches for T in CPU.contexts}
    assert set(saved["goals"]["loglinear_within_2x_mamba2"]) == cells
    variants = saved["goals"]["variants_within_2x_mamba2"]
    assert set(variants) == set(KERNEL_VARIANTS) and all(set(v) == cells for v in variants.values())
    assert variants["loglinear"] == saved["goals"]["loglinear_within_2x_mamba2"]
    assert saved["goals"]["loglinear_states_per_head_at_1M"]["bound"] == 20  # levels 1..20 of the next query


def test_a_kv_cache_over_the_limit_is_skipped_with_its_reason():
    from loglin_edu.bench.decode import CPU, measure
    from dataclasses import replace

    import torch

    row = measure("attention", 2, 64, replace(CPU, memory_limit_gib=1e-6), torch.device("cpu"))
    assert "step_ms" not in row and "exceeds the limit of 1e-06 GiB" in row["skipped"]


def test_the_fastest_tile_records_refused_slices_and_raises_other_errors():
    """A slice the split schedule refuses is kept with its reason; any other error is the step's own and is raised."""
    from dataclasses import replace

    import torch

    from loglin_edu.bench.decode import CPU, fastest_tile, tile_name
    from loglin_edu.kernels.decode_step import SliceRefused

    def step(block_v, num_warps, block_k):
        if block_k == 1:
            raise SliceRefused("too many programs")
        return torch.zeros(1)

    setting = replace(CPU, block_v=(8, 16))
    timed = fastest_tile(step, setting, torch.device("cpu"), block_k=(1, 16))
    assert timed["block_k"] == 16 and set(timed["refused_tiles"]) == {tile_name(8, None, 1), tile_name(16, None, 1)}
    with pytest.raises(ValueError, match="every tile was refused"):
        fastest_tile(step, setting, torch.device("cpu"), block_k=(1,))

    def broken(block_v, num_warps, block_k):
        raise ValueError("a bug, not a refusal")

    with pytest.raises(ValueError, match="a bug"):
        fastest_tile(broken, setting, torch.device("cpu"))
