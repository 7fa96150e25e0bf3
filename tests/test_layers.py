"""The layers: every form and backend computes the same layer, forward and backward; λ ≡ 1 recovers the
linear layer; the configured maximum length is enforced; the ensemble runs its members exactly."""

import os

import pytest
import torch

import loglin_edu as le
from loglin_edu.layers import (
    MIXERS,
    GatedConvolution,
    GatedDeltaNet,
    LanguageModel,
    LogLinearGatedDeltaNet,
    LogLinearMamba2,
    Mamba2,
    ModelConfig,
    SoftmaxAttention,
    build_model,
    count_parameters,
)
from loglin_edu.ops import KERNEL_FORM, forms, mix, resolve_backend
from loglin_edu.train import Ensemble
from operators import assert_close

D = 16


def make_layer(name, **options):
    cls = MIXERS[name]
    if name.startswith("loglinear"):
        options.setdefault("max_len", 64)
    if name in ("mamba2", "loglinear_mamba2"):
        options.setdefault("d_state", 4)
        options.setdefault("head_dim", 8)
    torch.manual_seed(0)
    layer = cls(D, **options).double()
    with torch.no_grad():  # move every parameter off its special initial value, so each one matters
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def forward_backward(layer, x):
    x = x.detach().clone().requires_grad_(True)
    out = layer(x)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype).to(out.device)
    (out * weights).sum().backward()
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    return out.detach(), x.grad, grads


@pytest.mark.parametrize("name", list(MIXERS))
@pytest.mark.parametrize("T", [1, 7, 37])
def test_every_form_gives_the_same_layer(name, T):
    layer = make_layer(name, backend="torch", chunk_size=8)
    x = torch.randn(2, T, D, dtype=torch.float64)
    layer.form = "naive"
    ref = forward_backward(layer, x)
    for form in ("recurrent", "chunkwise"):
        layer.form = form
        out, dx, grads = forward_backward(layer, x)
        assert_close(out, ref[0], what=f"{name} {form} output")
        assert_close(dx, ref[1], what=f"{name} {form} input grad")
        for n, g in grads.items():
            assert_close(g, ref[2][n], what=f"{name} {form} grad of {n}")


def test_softmax_sdpa_backend_matches_the_package_forms():
    layer = make_layer("transformer", backend="torch")
    x = torch.randn(2, 21, D, dtype=torch.float64)
    ref = forward_backward(layer, x)
    layer.backend = "sdpa"
    out, dx, grads = forward_backward(layer, x)
    assert_close(out, ref[0], what="sdpa output")
    assert_close(dx, ref[1], what="sdpa input grad")


def test_attention_convolution_comes_before_attention_and_stays_causal():
    """``SoftmaxAttention(conv_size=3)`` is the same layer without convolution applied to ``conv(x)``, with
    ``conv`` a causal depthwise convolution of width 3 (written here as a loop), and its output at ``t`` does not
    depend on later tokens."""
    layer = make_layer("transformer", backend="torch", conv_size=3, rope=False, form="naive")
    plain = SoftmaxAttention(D, conv_size=0, rope=False, backend="torch", form="naive").double()
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("conv.")})
    x = torch.randn(2, 13, D, dtype=torch.float64)
    w, b = layer.conv.weight[:, 0], layer.conv.bias  # [D, 3], [D]
    padded = torch.cat([x.new_zeros(2, 2, D), x], dim=1)
    shifted = torch.stack([sum(padded[:, t + i] * w[:, i] for i in range(3)) + b for t in range(13)], dim=1)
    assert_close(layer(x), plain(shifted), what="conv then attention")
    later = x.clone()
    later[:, 9:] = torch.randn(2, 4, D, dtype=torch.float64)
    assert_close(layer(later)[:, :9], layer(x)[:, :9], what="outputs before the changed tokens")
    assert not torch.allclose(layer(later)[:, 9:], layer(x)[:, 9:])
    with pytest.raises(ValueError, match="conv_size"):
        SoftmaxAttention(D, conv_size=-1)


def test_attention_without_rope_ignores_positions_with_rope_it_does_not():
    """Without RoPE (and without convolution) attention sees a set: the last output does not change when the
    earlier tokens are permuted; with RoPE it does."""
    x = torch.randn(1, 9, D, dtype=torch.float64)
    permuted = torch.cat([x[:, :8].flip(1), x[:, 8:]], dim=1)
    for rope in (False, True):
        layer = make_layer("transformer", backend="torch", rope=rope, form="naive")
        same = torch.allclose(layer(x)[:, -1], layer(permuted)[:, -1])
        assert same != rope


def test_gated_convolution_is_a_convolution_times_a_projection_plus_the_input():
    """``GatedConvolution``: ``conv(x) ⊙ (x W + b) + x`` with a causal depthwise convolution of width 3 (written
    here as a loop)."""
    torch.manual_seed(0)
    layer = GatedConvolution(D, 3).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 13, D, dtype=torch.float64)
    w, b = layer.conv.weight[:, 0], layer.conv.bias
    padded = torch.cat([x.new_zeros(2, 2, D), x], dim=1)
    conv = torch.stack([sum(padded[:, t + i] * w[:, i] for i in range(3)) + b for t in range(13)], dim=1)
    assert_close(layer(x), conv * (x @ layer.proj.weight.T + layer.proj.bias) + x, what="gated convolution")
    with pytest.raises(ValueError, match="kernel_size must be an integer >= 1"):
        GatedConvolution(D, 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_short_convolution_is_a_causal_depthwise_convolution(dtype):
    """``ShortConvolution`` equals PyTorch's grouped ``conv1d`` with ``w - 1`` zeros in front, then SiLU: to rounding
    in float64 and float32, exactly in bf16 (both sum in float32 and round once); its decoding step agrees."""
    import torch.nn.functional as F

    from loglin_edu.layers import ShortConvolution

    torch.manual_seed(0)
    layer = ShortConvolution(6, 4).to(dtype if dtype != torch.bfloat16 else torch.float32)
    x = torch.randn(3, 11, 6, dtype=dtype)
    padded = F.pad(x.transpose(1, 2), (3, 0))
    expected = F.silu(F.conv1d(padded, layer.weight.to(dtype), layer.bias.to(dtype), groups=6).transpose(1, 2))
    tolerance = dict(rtol=0, atol=0) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(layer(x), expected, **tolerance)
    window = torch.zeros(3, 3, 6, dtype=dtype)
    for t in range(x.shape[1]):
        y_t, window = layer.step(x[:, t], window)
        step_tolerance = 0.02 if dtype == torch.bfloat16 else 1e-6  # the step rounds its einsum in bf16
        torch.testing.assert_close(y_t.double(), expected[:, t].double(), rtol=step_tolerance, atol=step_tolerance)
    if dtype == torch.float64:
        x.requires_grad_(True)
        assert torch.autograd.gradcheck(layer, (x,))


def test_a_hybrid_model_puts_the_gated_convolution_in_the_even_layers():
    """``hybrid_conv=w``: layers 0, 2, ... are gated convolutions of width w, the others the mixer."""
    options = dict(num_heads=1, conv_size=0, rope=False, backend="torch", form="naive")
    config = ModelConfig("transformer", vocab_size=11, d_model=16, n_layers=3, hybrid_conv=3, mixer_options=options)
    kinds = [type(block.mixer) for block in build_model(config).blocks]
    assert kinds == [GatedConvolution, SoftmaxAttention, GatedConvolution]
    assert build_model(config).blocks[2].mixer.conv.kernel_size == 3
    plain = ModelConfig("transformer", vocab_size=11, d_model=16, n_layers=3, mixer_options=options)
    assert all(isinstance(block.mixer, SoftmaxAttention) for block in build_model(plain).blocks)
    for wrong in (-1, 1.5, True):
        with pytest.raises(ValueError, match="hybrid_conv must be an integer >= 0"):
            build_model(ModelConfig("transformer", vocab_size=11, d_model=16, hybrid_conv=wrong, mixer_options=options))


@pytest.mark.slow
def test_zoology_hybrid_transformer_learns_a_small_mqar():
    """Zoology's layout (a gated convolution layer of width 3, then attention, no position embedding) learns
    MQAR on a CPU: >= 95 % of the test queries (4 pairs, T = 32, 64 tokens) after 300 steps."""
    from loglin_edu.data import mqar
    from loglin_edu.train import Member, TrainConfig, train

    torch.set_num_threads(1)
    config = ModelConfig("transformer", vocab_size=64, d_model=32, max_len=32, hybrid_conv=3,
                         mixer_options=dict(num_heads=1, conv_size=0, rope=False, backend="torch", form="naive"))
    record = train(config, [Member(0, 1e-2)], [mqar(2000, 32, 4, 64, seed=1)], {"test": mqar(200, 32, 4, 64, seed=2)},
                   TrainConfig(steps=300, batch_size=32, warmup_steps=10, eval_every=300), progress=False)
    assert record["final"][0]["accuracy"] >= 0.95, record["final"][0]


@pytest.mark.slow
def test_transformer_with_its_convolution_learns_a_small_mqar():
    """Zoology's attention baseline (short convolution of width 3, no position embedding) learns MQAR on a CPU:
    >= 95 % of the test queries (4 pairs, T = 32, 64 tokens) after 300 steps."""
    from loglin_edu.data import mqar
    from loglin_edu.train import Member, TrainConfig, train

    torch.set_num_threads(1)
    config = ModelConfig("transformer", vocab_size=64, d_model=32, max_len=32,
                         mixer_options=dict(num_heads=1, conv_size=3, rope=False, backend="torch", form="naive"))
    record = train(config, [Member(0, 1e-2)], [mqar(2000, 32, 4, 64, seed=1)], {"test": mqar(200, 32, 4, 64, seed=2)},
                   TrainConfig(steps=300, batch_size=32, warmup_steps=10, eval_every=300), progress=False)
    assert record["final"][0]["accuracy"] >= 0.95, record["final"][0]


@pytest.mark.parametrize("linear_name, loglinear_name", [("mamba2", "loglinear_mamba2"), ("gated_deltanet", "loglinear_gated_deltanet")])
@pytest.mark.parametrize("form", ["naive", "recurrent", "chunkwise"])
def test_unit_level_scales_recover_the_linear_layer(linear_name, loglinear_name, form):
    loglinear = make_layer(loglinear_name, backend="torch", form=form, chunk_size=8)
    linear = make_layer(linear_name, backend="torch", form=form, chunk_size=8)
    state = loglinear.state_dict()
    if linear_name == "mamba2":  # the linear layer's in_proj is the first rows of the log-linear one's
        state["in_proj.weight"] = state["in_proj.weight"][: linear.in_proj.out_features]
    linear.load_state_dict({k: v for k, v in state.items() if k in linear.state_dict()})
    loglinear.level_scales.forward = lambda dl: torch.ones(*dl.shape[:2], loglinear.num_heads, loglinear.level_scales.num_levels,
                                                     dtype=dl.dtype)
    x = torch.randn(2, 37, D, dtype=torch.float64)
    assert_close(loglinear(x), linear(x), rtol=1e-12, what=f"{loglinear_name} with λ ≡ 1 vs {linear_name}")
    # and λ matters: with its own λ the layer differs
    del loglinear.level_scales.forward
    assert (loglinear(x) - linear(x)).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["loglinear_mamba2", "loglinear_gated_deltanet"])
def test_max_len_fixes_the_levels_and_is_enforced(name):
    layer = make_layer(name, max_len=16, backend="torch")
    assert layer.level_scales.num_levels == le.num_levels(16) == 5
    layer(torch.randn(1, 16, D, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"T=17.*max_len=16"):
        layer(torch.randn(1, 17, D, dtype=torch.float64))


def test_model_rejects_sequences_past_max_len():
    model = build_model(ModelConfig("mamba2", vocab_size=32, d_model=D, max_len=8, mixer_options=dict(d_state=4, head_dim=8)))
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_backend_resolution():
    x = torch.zeros(1)
    assert resolve_backend("auto", x, loglinear=True, beta=False) == "torch"  # CPU tensor
    from loglin_edu.ops import kernel_by_default

    assert kernel_by_default(True, False) and not kernel_by_default(True, True) and not kernel_by_default(False, False)
    assert resolve_backend("torch", x, loglinear=True, beta=False) == "torch"
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda", x, loglinear=True, beta=False)
    if KERNEL_FORM in forms():
        assert resolve_backend("triton", x, loglinear=True, beta=True) == "triton"  # log-linear Gated DeltaNet
        assert resolve_backend("triton", x, loglinear=False, beta=False) == "triton"  # Mamba-2
        assert resolve_backend("triton", x, loglinear=False, beta=True) == "triton"  # Gated DeltaNet
    with pytest.raises(ValueError, match="backend must be one of"):
        SoftmaxAttention(D, backend="triton")
    with pytest.raises(ValueError, match="form must be one of"):
        Mamba2(D, form="fast")


TRITON_ON_CPU = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(KERNEL_FORM not in forms(), reason="triton is not installed")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_triton_backend_matches_torch(device):
    if device == "cpu" and not TRITON_ON_CPU:
        pytest.skip("the Triton interpreter needs TRITON_INTERPRET=1 before triton is imported")
    torch.manual_seed(0)
    layer = LogLinearMamba2(32, d_state=16, head_dim=16, max_len=256, backend="torch").to(device)
    x = torch.randn(2, 200, 32, device=device)
    ref = forward_backward(layer, x)
    layer.backend = "triton"
    out, dx, grads = forward_backward(layer, x)
    rel = lambda a, b: (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()  # noqa: E731
    assert rel(out, ref[0]) < 2e-3 and rel(dx, ref[1]) < 2e-3
    for n, g in grads.items():
        assert rel(g, ref[2][n]) < 5e-3, n


@pytest.mark.slow
@pytest.mark.skipif(KERNEL_FORM not in forms(), reason="triton is not installed")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_triton_backend_trains_inside_the_ensemble(device):
    """The training ensemble (vmap over members) on the Triton backend: one training step of log-linear
    Mamba-2 gives the same loss and the same gradients as on the torch backend."""
    if device == "cpu" and not TRITON_ON_CPU:
        pytest.skip("the Triton interpreter needs TRITON_INTERPRET=1 before triton is imported")

    tokens = torch.randint(0, 32, (2, 3, 40), generator=torch.Generator().manual_seed(0)).to(device)  # [M, B, T]
    results = {}
    for backend in ("torch", "triton"):
        config = ModelConfig("loglinear_mamba2", vocab_size=32, d_model=16, n_layers=1, max_len=64,
                             mixer_options=dict(d_state=8, head_dim=8, chunk_size=16, backend=backend))
        ensemble = Ensemble([build_model(config, seed=s) for s in (0, 1)]).to(device)
        loss = ensemble(tokens).float().logsumexp(-1).mean()
        loss.backward()
        results[backend] = (loss.detach(), {n: p.grad.clone() for n, p in ensemble.named_parameters()})
    assert_close(results["triton"][0], results["torch"][0], rtol=1e-5, what="loss")
    for name, grad in results["torch"][1].items():
        assert_close(results["triton"][1][name], grad, rtol=1e-4, atol=1e-7, what=name)


def test_operators_run_in_float32_under_autocast():
    q, k, v = torch.randn(1, 10, 1, 4), torch.randn(1, 10, 1, 4), torch.randn(1, 10, 2, 3)
    g = -torch.rand(1, 10, 2)
    lam = torch.rand(1, 10, 2, 5)
    ref = mix(q, k, v, g, None, lam)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mix(q.bfloat16(), k.bfloat16(), v.bfloat16(), g.bfloat16(), None, lam.bfloat16())
    assert out.dtype == torch.float32
    assert_close(out, mix(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), g.bfloat16().float(), None,
                          lam.bfloat16().float()), rtol=1e-6, what="autocast mix")
    assert ref.dtype == torch.float32


def test_log_linear_layers_add_exactly_the_lambda_parameters():
    L = le.num_levels(256)
    for linear, loglinear in (("mamba2", "loglinear_mamba2"), ("gated_deltanet", "loglinear_gated_deltanet")):
        configs = [ModelConfig(m, vocab_size=100, d_model=32, n_layers=2, max_len=256) for m in (linear, loglinear)]
        small, big = (count_parameters(build_model(c)) for c in configs)
        heads = build_model(configs[1]).blocks[0].mixer.num_heads
        # per layer: a projection of d_model inputs to H·L values, plus the H·L weights L[h, ℓ]
        assert big["total"] - small["total"] == 2 * (heads * L * 32 + heads * L)
        assert small["embedding"] == big["embedding"] == 100 * 32  # the head is tied to the embedding


@pytest.mark.parametrize("name", ["loglinear_mamba2", "loglinear_gated_deltanet"])
def test_tied_levels_give_one_scale_per_token_and_one_projection_output_per_head(name):
    """With ``tie_levels`` every level of a token gets the same λ, from H projection outputs instead of H·L;
    and log-linear attention with such a λ is the linear model's output scaled by λ_t (every form)."""
    L = le.num_levels(64)
    tied, free = make_layer(name, tie_levels=True), make_layer(name)
    H = tied.num_heads
    assert count_parameters(free)["total"] - count_parameters(tied)["total"] == H * (L - 1) * (D + 1)
    captured = []
    hook = tied.level_scales.register_forward_hook(lambda _m, _i, out: captured.append(out))
    tied(torch.randn(2, 21, D, dtype=torch.float64))
    hook.remove()
    assert captured[0].shape == (2, 21, H, L) and torch.equal(captured[0], captured[0][..., :1].expand_as(captured[0]))
    q, k, v = torch.randn(2, 21, H, 3, dtype=torch.float64), torch.randn(2, 21, H, 3, dtype=torch.float64), \
        torch.randn(2, 21, H, 4, dtype=torch.float64)
    g, beta = -torch.rand(2, 21, H, dtype=torch.float64), torch.rand(2, 21, H, dtype=torch.float64)
    gate = torch.rand(2, 21, H, 1, dtype=torch.float64)
    if name == "loglinear_mamba2":
        beta, linear = None, le.mamba2_attention(q, k, v, g, form="naive")
    else:
        linear = le.gated_deltanet_attention(q, k, v, g, beta, form="naive")
    for form in ("naive", "recurrent", "chunkwise"):
        out = le.loglinear_attention(q, k, v, gate.expand(-1, -1, -1, L), g, beta, form=form, chunk_size=8)
        assert_close(out, gate * linear, what=f"{form}: tied λ against the gated linear model")


def test_model_reads_logits_at_chosen_positions():
    model = build_model(ModelConfig("gated_deltanet", vocab_size=50, d_model=D, mlp=True), seed=3)
    tokens = torch.randint(0, 50, (3, 11))
    positions = torch.tensor([0, 5, 12, 32])
    assert torch.equal(model(tokens, positions), model(tokens).flatten(0, 1)[positions])
    assert isinstance(model, LanguageModel) and model.blocks[0].mlp is not None


@pytest.mark.parametrize("name", list(MIXERS))
def test_ensemble_runs_each_member_exactly(name):
    config = ModelConfig(name, vocab_size=40, d_model=D, max_len=32,
                         mixer_options=dict(backend="torch", chunk_size=8) | ({} if name == "transformer" else {}))
    models = [build_model(config, seed=s).double() for s in (0, 1, 2)]
    ensemble = Ensemble(models)
    tokens = torch.randint(0, 40, (3, 2, 19))
    positions = torch.tensor([[1, 20, 37]] * 3)
    out = ensemble(tokens, positions)
    out.sum().backward()
    for i, model in enumerate(models):
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        alone = model(tokens[i], positions[i])
        alone.sum().backward()
        assert_close(out[i], alone, what=f"{name} member {i} output")
        for n, p in model.named_parameters():
            assert_close(grads[n], p.grad, what=f"{name} member {i} grad of {n}")


def test_members_take_their_gradients_without_a_copy_each():
    """A stacked weight's gradient comes back contiguous, so autograd hands each member its slice instead of copying
    it (Gated DeltaNet's weight gradients come out of their products transposed: a copy per member and weight)."""
    from torch.profiler import ProfilerActivity, profile

    config = ModelConfig("gated_deltanet", vocab_size=32, d_model=D, max_len=32, mixer_options=dict(chunk_size=16))
    ensemble = Ensemble([build_model(config, seed=s) for s in (0, 1)])
    tokens = torch.randint(0, 32, (2, 2, 32), generator=torch.Generator().manual_seed(0))
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        ensemble(tokens).square().mean().backward()
    copies = [e for e in recorded.events() if e.name == "aten::copy_" and e.cpu_parent is not None
              and "AccumulateGrad" in e.cpu_parent.name]
    assert not copies
    assert all(p.grad is not None for p in ensemble.parameters())


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MIXERS))
def test_ensemble_on_cuda_matches_float64_on_cpu(name):
    """The GPU tier's models (3-member ensembles, float32, no TF32) against the same weights in float64 on the CPU."""
    from loglin_edu.experiments import mqar as experiment

    torch.backends.cuda.matmul.allow_tf32 = False
    config = experiment.model_config(experiment.TIERS["gpu/mqar"], name, 32)
    gpu = Ensemble([build_model(config, seed=s) for s in range(3)]).cuda()
    cpu = Ensemble([build_model(config, seed=s).double() for s in range(3)])
    tokens, positions = torch.randint(0, 8192, (3, 4, 256)), torch.randint(0, 1024, (3, 100))
    out = gpu(tokens.cuda(), positions.cuda())
    out.square().mean().backward()
    ref = cpu(tokens, positions)
    ref.square().mean().backward()
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 1e-5
    grad = torch.cat([p.grad.flatten() for p in gpu.parameters()]).double().cpu()
    grad_ref = torch.cat([p.grad.flatten() for p in cpu.parameters()])
    assert ((grad - grad_ref).norm() / grad_ref.norm()).item() < 1e-4
