"""The training step in its three modes: compiled and captured steps compute what the eager step computes."""

from dataclasses import replace

import pytest
import torch

from loglin_edu.data import mqar
from loglin_edu.layers import MIXERS, ModelConfig
from loglin_edu.train import Member, TrainConfig, train
from loglin_edu.train.step import step_mode

TRAIN = [mqar(64, 16, 2, 32, seed=1), mqar(64, 16, 4, 32, seed=2)]
TEST = {"pairs=2": mqar(16, 16, 2, 32, seed=3)}
MEMBERS = [Member(0, 3e-3), Member(1, 1e-2), Member(2, 10**-1.5)]
STEPS = TrainConfig(steps=8, batch_size=8, warmup_steps=2, eval_every=4)


def config(name, backend="torch"):
    options = dict(backend="torch", form="naive", conv_size=3, rope=False) if name == "transformer" else \
        dict(backend=backend, chunk_size=4)
    return ModelConfig(name, vocab_size=32, d_model=16, max_len=16, mixer_options=options)


def trained(name, tmp_path, label, device="cpu", backend="torch", **modes):
    record = train(config(name, backend), MEMBERS, TRAIN, TEST, replace(STEPS, **modes), out_dir=tmp_path / label,
                   progress=False, device=device)
    weights = torch.load(tmp_path / label / "checkpoint.pt", weights_only=False, map_location="cpu")["models"]
    return record, weights


def assert_same_training(eager, other, rtol, weights_rtol=None, norm=False):
    """Same losses at every evaluation (``rtol``) and the same weights after the last step (``weights_rtol``,
    default ``rtol``), to float32 rounding. The weights' difference is measured against the tensor's largest
    entry (``max|a - b| / max|a|``), or with ``norm`` against its norm (``‖a - b‖ / ‖a‖``)."""
    (record_a, weights_a), (record_b, weights_b) = eager, other
    losses_a = torch.tensor([line["train_loss"] for line in record_a["history"]])
    losses_b = torch.tensor([line["train_loss"] for line in record_b["history"]])
    assert torch.allclose(losses_a, losses_b, rtol=rtol, atol=0), (losses_a, losses_b)
    size = (lambda x: x.norm()) if norm else (lambda x: x.abs().max())
    for a, b in zip(weights_a, weights_b):
        for key in a:
            relative = (size(a[key] - b[key]) / size(a[key]).clamp(min=1e-6)).item()
            assert relative < (weights_rtol or rtol), f"{key}: relative difference {relative:.2e}"


def assert_same_checkpoints(a_dir, b_dir, rtol, atol):
    """The members' weights in two run folders' checkpoints agree to ``rtol``/``atol``."""
    a = torch.load(a_dir / "checkpoint.pt", weights_only=False, map_location="cpu")["models"]
    b = torch.load(b_dir / "checkpoint.pt", weights_only=False, map_location="cpu")["models"]
    for x, y in zip(a, b, strict=True):
        for key in x:
            assert torch.allclose(x[key], y[key], rtol=rtol, atol=atol), key


def test_step_modes_are_named_and_graphs_need_cuda(tmp_path):
    assert [step_mode(replace(STEPS, compile=c, graphs=g)) for c in (False, True) for g in (False, True)] == \
        ["eager", "graphs", "compiled", "compiled+graphs"]
    with pytest.raises(ValueError, match="CUDA"):
        train(config("mamba2"), MEMBERS, TRAIN, TEST, replace(STEPS, graphs=True), progress=False)


@pytest.mark.slow
def test_compiled_step_equals_the_eager_step(tmp_path):
    """torch.compile fuses the loss's forward and backward; after 8 steps of three members the losses and
    weights agree with eager to float32 rounding (the Transformer: the fastest model to compile on a CPU)."""
    torch.set_num_threads(1)
    eager = trained("transformer", tmp_path, "eager")
    compiled = trained("transformer", tmp_path, "compiled", compile=True)
    assert compiled[0]["step_mode"] == "compiled" and eager[0]["step_mode"] == "eager"
    assert_same_training(eager, compiled, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MIXERS))
@pytest.mark.parametrize("compile", [False, True])
def test_captured_step_equals_the_eager_step_on_cuda(tmp_path, name, compile):
    """The whole step recorded in a CUDA graph (after its eager steps) trains as the eager step does.

    On the GPU two runs of one step already differ in the last bits (the embedding's backward adds its rows in
    no fixed order), and a compiled step rounds differently from the eager one. AdamW divides by √v, which
    magnifies those bits in the few entries whose gradient is near zero: there a weight can move by a good
    part of one update (about the learning rate) in one run and not in the other. Compiling alone on the CPU,
    where each run is deterministic, Gated DeltaNet's weights at learning rate 10^-2 differ after 8 steps by
    4.5e-3 of a tensor's largest entry (in 4 of its 256 entries) and 1.2e-3 of its norm, while the losses
    agree to 1e-5. So the losses are held to 1e-4 at every evaluation and the weights to 1e-2 of their norm:
    a step that reads a stale batch or learning rate changes every entry's update, not a few, and the losses
    after it."""
    torch.backends.cuda.matmul.allow_tf32 = False
    eager = trained(name, tmp_path, "eager", device="cuda")
    captured = trained(name, tmp_path, "captured", device="cuda", graphs=True, compile=compile)
    assert captured[0]["capture_error"] is None
    assert captured[0]["step_mode"] == ("compiled+graphs" if compile else "graphs")
    assert_same_training(eager, captured, rtol=1e-4, weights_rtol=1e-2, norm=True)


def test_tf32_matmuls_is_set_inside_and_restored_after():
    from loglin_edu.train.step import tf32_matmuls

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        with tf32_matmuls(True):
            assert torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cuda.matmul.allow_tf32
        with tf32_matmuls(False):
            assert not torch.backends.cuda.matmul.allow_tf32
        with pytest.raises(RuntimeError), tf32_matmuls(True):
            raise RuntimeError("a failing step")
        assert not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.gpu
def test_a_captured_tf32_step_equals_the_eager_tf32_step(tmp_path):
    """With TF32 products the captured step records the precision it runs in: it trains as the eager TF32 step."""
    torch.backends.cuda.matmul.allow_tf32 = False
    eager = trained("loglinear_mamba2", tmp_path, "eager", device="cuda", tf32=True)
    captured = trained("loglinear_mamba2", tmp_path, "captured", device="cuda", graphs=True, tf32=True)
    assert captured[0]["capture_error"] is None and not torch.backends.cuda.matmul.allow_tf32
    assert_same_training(eager, captured, rtol=1e-4, weights_rtol=1e-2, norm=True)


KERNEL_MODELS = ["mamba2", "loglinear_mamba2", "gated_deltanet", "loglinear_gated_deltanet"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", KERNEL_MODELS)
def test_the_kernel_step_trains_as_the_pytorch_step(tmp_path, name):
    """backend="triton" (the Triton kernels inside the vmapped ensemble, without TF32: exact fp32 products, tf32x3 in
    Gated DeltaNet's operator) trains as the PyTorch forms do, to the tolerance of two eager GPU runs (see the test
    above)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    forms = trained(name, tmp_path, "torch", device="cuda")
    kernels = trained(name, tmp_path, "triton", device="cuda", backend="triton")
    assert_same_training(forms, kernels, rtol=1e-4, weights_rtol=1e-2, norm=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [m for m in KERNEL_MODELS if m != "loglinear_gated_deltanet"])
def test_a_captured_tf32_kernel_step_equals_the_eager_one(tmp_path, name):
    """The fastest step of chapter 11's benchmark — the kernels, TF32 products, compiled and captured — trains as
    the same step run eagerly. Not log-linear Gated DeltaNet: its eager step runs other kernels than its compiled
    one (:func:`loglin_edu.ops.mix`), which keep each chunk's factors and solve in tf32x3; its compiled form is
    checked against float64 in ``test_kernels_gdn_gpu.py``."""
    torch.backends.cuda.matmul.allow_tf32 = False
    eager = trained(name, tmp_path, "eager", device="cuda", backend="triton", tf32=True)
    captured = trained(name, tmp_path, "captured", device="cuda", backend="triton", tf32=True, graphs=True,
                       compile=True)
    assert captured[0]["capture_error"] is None and captured[0]["step_mode"] == "compiled+graphs"
    assert_same_training(eager, captured, rtol=1e-4, weights_rtol=1e-2, norm=True)


@pytest.mark.gpu
def test_a_captured_run_resumes_as_if_uninterrupted(tmp_path):
    """Stopped after 5 steps and started again (a new capture), a captured run ends with the weights of one that
    never stopped."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = replace(STEPS, graphs=True, checkpoint_every=2)
    straight = train(config("loglinear_mamba2"), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "a", progress=False,
                     device="cuda")
    train(config("loglinear_mamba2"), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "b", progress=False, device="cuda",
          stop_at=5)
    resumed = train(config("loglinear_mamba2"), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "b", progress=False,
                    device="cuda")
    assert resumed["complete"]
    assert straight["final"][0]["train_loss"] == pytest.approx(resumed["final"][0]["train_loss"], rel=1e-5)
    assert_same_checkpoints(tmp_path / "a", tmp_path / "b", rtol=1e-5, atol=1e-7)


def test_step_time_benchmark_writes_its_rows(tmp_path):
    """The benchmark's processes (one per mixer) take turns and write one row per mode, with provenance."""
    import json

    from loglin_edu.experiments.mqar import step_time

    out = tmp_path / "step.json"
    step_time.main(["--out", str(out), "--tier", "cpu", "--width", "16", "--models", "mamba2", "--modes", "eager",
                    "--train-examples", "100", "--device", "cpu", "--chunk-size", "4", "--tf32"])
    result = json.loads(out.read_text())
    assert result["chunk_size"] == 4 and result["backend"] == "torch" and "chunk 4" in result["what"]
    assert result["tf32"] and not result["amp"] and "TF32 products True" in result["what"]
    assert not result["failed"] and result["complete"]
    assert result["transformer"] == dict(conv_size=3, rope=False, hybrid=False)  # the cpu tier's layout
    assert [(r["model"], r["mode"], r["chunk_size"]) for r in result["rows"]] == [("mamba2", "eager", 4)]
    assert result["rows"][0]["ms_per_step"] > 0 and {"commit", "device", "versions"} <= result.keys()
    assert list(tmp_path.iterdir()) == [out]  # the processes' working files stay out of the results folder
    assert step_time.speedups([dict(model="m", mode="eager", ms_per_step=10.0),
                               dict(model="m", mode="graphs", ms_per_step=2.0)]) == {"m": {"graphs": 5.0}}


def test_step_kernels_are_per_step_and_longest_first():
    """The profile divides every kernel's launches and time by the steps recorded, and sums them."""
    from loglin_edu.experiments.mqar import step_time

    calls = []

    def times(run):
        run()
        return {"small": [20, 4.0], "large": [10, 30.0]}

    kernels = step_time.step_kernels(lambda: calls.append(1), steps=10, times=times)
    assert len(calls) == 10
    assert kernels["kernels"] == [["large", 1.0, 3.0], ["small", 2.0, 0.4]]
    assert kernels["kernel_ms_per_step"] == pytest.approx(3.4) and kernels["kernel_launches_per_step"] == 3.0


def test_kernel_groups_take_each_kernel_once_by_its_name():
    """Each kernel lands in the first group whose marks its name holds (a fused kernel with a scatter-add in the
    scatter group, not the plain fused one), unknown names in the rest, and no time is lost or counted twice."""
    from loglin_edu.experiments.mqar import step_time

    kernels = [["triton_per_fused_gather_scatter_add_mul_1", 1, 1.5], ["triton_poi_fused_silu_2", 2, 0.5],
               ["void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64>", 3, 1.0],
               ["void at::native::multi_tensor_apply_kernel<...>", 24, 0.25], ["Memset (Device)", 1, 0.125]]
    groups = step_time.kernel_groups(kernels)
    assert groups == {"matrix products": 1.0, "optimiser and clipping": 0.25,
                      "fused with a scatter (λ's gather, backward)": 1.5, "fused by torch.compile": 0.5,
                      step_time.OTHER_KERNELS: 0.125}
    assert sum(groups.values()) == sum(k[2] for k in kernels)


@pytest.mark.gpu
def test_a_run_resumed_in_another_step_mode_trains_on(tmp_path):
    """Stopped in eager mode and resumed with its step captured (as a later piece may choose), a run ends where an
    eager run that never stopped ends, to float32 rounding."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = replace(STEPS, checkpoint_every=2)
    train(config("gated_deltanet"), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "a", progress=False, device="cuda")
    train(config("gated_deltanet"), MEMBERS, TRAIN, TEST, cfg, out_dir=tmp_path / "b", progress=False, device="cuda",
          stop_at=5)
    resumed = train(config("gated_deltanet"), MEMBERS, TRAIN, TEST, replace(cfg, graphs=True), out_dir=tmp_path / "b",
                    progress=False, device="cuda")
    assert resumed["complete"] and resumed["step_mode"] == "graphs" and resumed["capture_error"] is None
    assert_same_checkpoints(tmp_path / "a", tmp_path / "b", rtol=1e-4, atol=1e-6)


def test_a_compilation_that_fails_leaves_the_run_uncompiled(monkeypatch):
    """torch.compile raising at the first step (an unsupported operator, a missing compiler): the run trains on
    uncompiled, records why, and its steps equal an eager run's."""
    def broken(fn, **_):
        def call(*args):
            raise RuntimeError("no compiler here")
        return call

    eager = train(config("mamba2"), MEMBERS, TRAIN, TEST, STEPS, progress=False)
    monkeypatch.setattr(torch, "compile", broken)
    fallen = train(config("mamba2"), MEMBERS, TRAIN, TEST, replace(STEPS, compile=True), progress=False)
    assert fallen["compile_error"] == "RuntimeError: no compiler here" and fallen["step_mode"] == "eager"
    assert [line["train_loss"] for line in fallen["history"]] == [line["train_loss"] for line in eager["history"]]


def test_one_step_mode_for_a_piece_counts_its_compilation(tmp_path):
    """Compiled steps are 3x faster but take 100 s to compile (scaled by the piece's jobs per measured model):
    worth it in a long piece, not in a short one; a mode that failed for a model is never chosen."""
    import json

    from loglin_edu.experiments.mqar.__main__ import mode_from

    def row(model, mode, ms, first, **extra):
        return dict(model=model, mode=mode, ms_per_step=ms, seconds_to_first_step=first, capture_error=None, **extra)

    rows = [row(m, "graphs", 30.0, 5.0) for m in ("a", "b")] + [row(m, "compiled+graphs", 10.0, 100.0) for m in ("a", "b")]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(dict(modes=["graphs", "compiled+graphs"], rows=rows)))
    assert mode_from(path, budget_s=3000, jobs=4) == "compiled+graphs"  # (3000 - 200) / 20 ms > (3000 - 10) / 60 ms
    assert mode_from(path, budget_s=250, jobs=4) == "graphs"  # (250 - 200) / 20 ms < (250 - 10) / 60 ms
    assert mode_from(path, budget_s=None, jobs=4) == "compiled+graphs"
    rows[-1] = dict(model="b", mode="compiled+graphs", error="RuntimeError: no compiler")
    path.write_text(json.dumps(dict(modes=["graphs", "compiled+graphs"], rows=rows)))
    assert mode_from(path, budget_s=3000, jobs=4) == "graphs"


def test_members_are_clipped_as_clip_grad_norm_clips_each():
    """One pass over every member's gradients clips each member as ``clip_grad_norm_`` does, bit for bit."""
    import copy

    from torch import nn

    from loglin_edu.train.step import clip_member_gradients

    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4)) for _ in range(3)]
    for i, m in enumerate(members):
        (m(torch.randn(7, 5)) * 10.0 ** (i - 2)).pow(2).sum().backward()  # norms above and below the threshold
    alone = copy.deepcopy(members)
    for m, a in zip(members, alone):
        for p, q in zip(m.parameters(), a.parameters()):
            q.grad = p.grad.clone()
    expected = [nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True) for m in alone]
    norms = clip_member_gradients(members, 1.0)
    assert torch.equal(norms, torch.stack(expected)) and norms.min() < 1.0 < norms.max()
    for m, a in zip(members, alone):
        for p, q in zip(m.parameters(), a.parameters()):
            assert torch.equal(p.grad, q.grad)
