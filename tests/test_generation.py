"""Decoding through the layers and the model: prefill + cached steps compute the full forward (float64,
1e-10), greedy generation is the argmax of re-running the forward, and a wrong cache is refused."""

import pytest
import torch

from loglin_edu.layers import MIXERS, ModelConfig, build_model
from operators import assert_close
from test_layers import D, make_layer

NAMES = list(MIXERS)


@pytest.mark.parametrize("name", NAMES)
def test_layer_prefill_then_steps_is_the_forward(name):
    layer = make_layer(name, backend="torch", chunk_size=8)
    x = torch.randn(2, 37, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full = layer(x)
    for t in (0, 1, 8, 9, 17, 36):
        if t == 0:
            head, cache = x[:, :0], layer.init_cache(2, 40, dtype=torch.float64)
        else:
            head, cache = layer.prefill(x[:, :t], max_len=40)
        assert cache.position == t
        tail = [layer.step(x[:, s], cache) for s in range(t, 37)]
        got = torch.cat([head if t else full[:, :0], torch.stack(tail, dim=1)], dim=1)
        assert_close(got, full, what=f"{name}: prefill {t} + {37 - t} steps")
        assert cache.position == 37


def test_transformer_with_its_convolution_decodes_as_its_forward():
    """The convolution's last inputs travel in the KV cache: prefill + steps give the forward, with and without RoPE."""
    for rope in (False, True):
        layer = make_layer("transformer", backend="torch", conv_size=3, rope=rope)
        x = torch.randn(2, 21, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        full = layer(x)
        for t in (0, 1, 2, 9):
            head, cache = (full[:, :0], layer.init_cache(2, 24, dtype=torch.float64)) if t == 0 else \
                layer.prefill(x[:, :t], max_len=24)
            got = torch.cat([head, torch.stack([layer.step(x[:, s], cache) for s in range(t, 21)], dim=1)], dim=1)
            assert_close(got, full, what=f"rope={rope}: prefill {t} + steps")
        assert "conv_size=3" in cache.owner


@pytest.mark.parametrize("name", ["loglinear_mamba2", "loglinear_gated_deltanet"])
def test_tied_levels_decode_as_their_forward(name):
    layer = make_layer(name, backend="torch", chunk_size=8, tie_levels=True)
    x = torch.randn(2, 19, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    head, cache = layer.prefill(x[:, :5], max_len=24)
    got = torch.cat([head, torch.stack([layer.step(x[:, s], cache) for s in range(5, 19)], dim=1)], dim=1)
    assert_close(got, layer(x), what=f"{name}, λ tied: prefill 5 + steps")


def tiny_model(name, seed=0, **changes):
    options = {"d_state": 4, "head_dim": 8} if "mamba2" in name else {"num_heads": 2}
    config = ModelConfig(mixer=name, vocab_size=11, d_model=16, n_layers=2, max_len=48, mixer_options=options)
    for key, value in changes.items():
        setattr(config, key, value)
    model = build_model(config, seed=seed).double()
    with torch.no_grad():  # move the mixers' parameters off their initial values, so every one matters
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


@pytest.mark.parametrize("name", NAMES)
def test_model_step_is_the_forward_at_the_last_position(name):
    model = tiny_model(name, mlp=name == "transformer")
    tokens = torch.randint(0, 11, (3, 30), generator=torch.Generator().manual_seed(1))
    full = model(tokens)
    logits, cache = model.prefill(tokens[:, :13], max_len=30)
    assert_close(logits, full[:, :13], what=f"{name} prefill logits")
    for t in range(13, 30):
        assert_close(model.step(tokens[:, t], cache), full[:, t], what=f"{name} step logits at t={t}")


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generation_is_the_argmax_of_the_full_forward(name):
    model = tiny_model(name, seed=2)
    prompt = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(3))
    generated = model.generate(prompt, max_new_tokens=20, temperature=0)
    sequence = prompt
    for _ in range(20):
        sequence = torch.cat([sequence, model(sequence)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, sequence)


def test_a_hybrid_model_decodes_as_its_forward():
    """Gated convolution layers between attention layers (``hybrid_conv=3``): the layer's prefill + steps and the
    model's give the forward, and greedy generation is the argmax of re-running it."""
    from loglin_edu.layers import GatedConvolution

    layer = GatedConvolution(D, 3).double()
    x = torch.randn(2, 15, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    for t in (0, 1, 2, 9):
        head, cache = (layer(x)[:, :0], layer.init_cache(2, 16, dtype=torch.float64)) if t == 0 else \
            layer.prefill(x[:, :t], max_len=16)
        got = torch.cat([head, torch.stack([layer.step(x[:, s], cache) for s in range(t, 15)], dim=1)], dim=1)
        assert_close(got, layer(x), what=f"gated convolution: prefill {t} + steps")
    model = tiny_model("transformer", seed=4, hybrid_conv=3)
    tokens = torch.randint(0, 11, (2, 24), generator=torch.Generator().manual_seed(6))
    full = model(tokens)
    logits, cache = model.prefill(tokens[:, :7], max_len=24)
    assert_close(logits, full[:, :7], what="hybrid prefill logits")
    for t in range(7, 24):
        assert_close(model.step(tokens[:, t], cache), full[:, t], what=f"hybrid step logits at t={t}")
    generated = model.generate(tokens[:, :5], max_new_tokens=12, temperature=0)
    sequence = tokens[:, :5]
    for _ in range(12):
        sequence = torch.cat([sequence, model(sequence)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, sequence)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = tiny_model("loglinear_mamba2")
    prompt = torch.tensor([1, 2, 3])
    first = model.generate(prompt, 15, temperature=1.5, seed=7)
    assert first.shape == (18,) and torch.equal(first[:3], prompt)
    assert torch.equal(model.generate(prompt, 15, temperature=1.5, seed=7), first)
    assert not torch.equal(model.generate(prompt, 15, temperature=1.5, seed=8), first)
    assert torch.equal(model.generate(prompt, 15, temperature=1.0, top_k=1, seed=1), model.generate(prompt, 15, 0))


def test_generation_shows_progress(capsys):
    model = tiny_model("mamba2")
    model.generate(torch.tensor([[1, 2]]), 5, temperature=0, progress=True)
    assert "generate" in capsys.readouterr().err


def test_decoding_past_max_len_is_refused():
    model = tiny_model("loglinear_gated_deltanet")
    tokens = torch.zeros(1, 5, dtype=torch.long)
    _, cache = model.prefill(tokens, max_len=6)
    model.step(tokens[:, 0], cache)
    with pytest.raises(ValueError, match="decoding past max_len=6: the cache already holds 6 tokens"):
        model.step(tokens[:, 0], cache)
    with pytest.raises(ValueError, match="max_len=49 is more than the model's max_len=48"):
        model.prefill(tokens, max_len=49)
    with pytest.raises(ValueError, match="T=40 tokens plus max_new_tokens=9 is longer than the model's max_len=48"):
        model.generate(torch.zeros(40, dtype=torch.long), 9)
    layer = make_layer("loglinear_mamba2")
    with pytest.raises(ValueError, match="max_len=65 is more than LogLinearMamba2"):
        layer.init_cache(1, 65)
    cache = layer.init_cache(1, 1, dtype=torch.float64)
    layer.step(torch.zeros(1, D, dtype=torch.float64), cache)
    with pytest.raises(ValueError, match="decoding past max_len=1"):
        layer.step(torch.zeros(1, D, dtype=torch.float64), cache)


def test_a_cache_of_another_batch_or_model_is_refused():
    model = tiny_model("transformer")
    _, cache = model.prefill(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token must have shape \[B=2\] \(the cache's batch\), got \(3,\)"):
        model.step(torch.zeros(3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="made by another model: same configuration, other weights"):
        tiny_model("transformer").step(torch.zeros(2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"made by another model: its configuration differs.*'mixer': \('transformer', 'mamba2'\)"):
        tiny_model("mamba2").step(torch.zeros(2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="must be a ModelCache"):
        model.step(torch.zeros(2, dtype=torch.long), cache.layers[0])
    mamba, other = make_layer("mamba2"), make_layer("mamba2", d_state=8)
    layer_cache = mamba.init_cache(2, 10)
    with pytest.raises(ValueError, match=r"made by another layer: Mamba2\(.*d_state=4.*\), not Mamba2\(.*d_state=8"):
        other.step(torch.zeros(2, D, dtype=torch.float64), layer_cache)
    with pytest.raises(ValueError, match=r"x_t must have shape \[B=2, d_model\]"):
        mamba.step(torch.zeros(1, D, dtype=torch.float64), layer_cache)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(max_new_tokens=-1), "max_new_tokens must be an int >= 0"),
        (dict(max_new_tokens=2, temperature=-1.0), "temperature must be >= 0"),
        (dict(max_new_tokens=2, top_k=0), "top_k must be None or an int >= 1"),
        (dict(prompt=torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2), "at least one token"),
        (dict(prompt=torch.zeros(2, 2), max_new_tokens=2), "prompt must be an int tensor"),
    ],
)
def test_generate_checks_its_arguments(kwargs, words):
    kwargs = {"prompt": torch.zeros(1, 3, dtype=torch.long)} | kwargs
    with pytest.raises(ValueError, match=words):
        tiny_model("mamba2").generate(**kwargs)


def test_cache_memory_grows_as_the_mixer_says():
    """KV cache: linear in max_len; one state: constant; Fenwick levels: num_levels(max_len) - 1 states (the levels
    1..L of the next query; its own token, level 0, comes with the step)."""
    attention = make_layer("transformer")
    assert attention.init_cache(1, 4096).state_bytes() == 64 * attention.init_cache(1, 64).state_bytes()
    for linear in ("mamba2", "gated_deltanet"):
        cache = make_layer(linear).init_cache(1, 64)
        assert make_layer(linear).init_cache(1, 4096).state_bytes() == cache.state_bytes()
        one_state = cache.tensors["state"].numel() * cache.tensors["state"].element_size()
        windows = cache.state_bytes() - one_state
        loglinear = make_layer("loglinear_" + linear, max_len=4096)
        for max_len, levels in ((64, 6), (4096, 12)):
            fenwick = loglinear.init_cache(1, max_len).levels
            scales = 0  # the lazy layout's decay scales: one per level, head and value column
            if linear == "mamba2":
                assert fenwick.lazy
                scales = levels * one_state // loglinear.d_state
            assert loglinear.init_cache(1, max_len).state_bytes() == windows + levels * one_state + scales
