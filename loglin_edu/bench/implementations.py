"""The implementations the benchmark runs side by side, each a function of the inputs of
:func:`~loglin_edu.bench.settings.prepare`, registered with the inputs it differentiates."""

from __future__ import annotations

import torch


def ours(inputs, config=None):
    from ..kernels.step5_loglinear_mamba2 import loglinear_mamba2

    x = inputs
    return loglinear_mamba2(x["q"], x["k"], x["v"], x["level_scales"], x["log_decay"], config=config)


def ours_linear(inputs):
    from ..kernels.step1_mamba2_chunked import mamba2_triton

    x = inputs
    return mamba2_triton(x["q"], x["k"], x["v"], x["log_decay"])


def ours_linear_parallel(inputs, config=None):
    from ..kernels.step1b_mamba2_parallel import mamba2_triton_parallel

    x = inputs
    return mamba2_triton_parallel(x["q"], x["k"], x["v"], x["log_decay"], config=config)


def torch_chunkwise(inputs):
    from ..ops import loglinear_attention

    x = inputs
    return loglinear_attention(x["q"], x["k"], x["v"], x["level_scales"], x["log_decay"], form="chunkwise", chunk_size=16)


def sdpa(inputs):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = inputs["sdpa"]
    backend = SDPBackend.FLASH_ATTENTION if q.is_cuda else SDPBackend.MATH
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def fla_loglinear(inputs):
    from fla.ops.log_linear_attn import chunk_log_linear_attn

    x = inputs
    return chunk_log_linear_attn(x["q"], x["k"], x["v"], x["log_decay"], x["level_scales"], scale=1.0)[0]


def ours_gated_deltanet(inputs, config=None):
    from ..kernels.step9_loglinear_gated_deltanet import loglinear_gated_deltanet

    x = inputs
    return loglinear_gated_deltanet(x["q"], x["k"], x["v"], x["level_scales"], x["log_decay"], x["beta"], config=config)


def torch_chunkwise_gated_deltanet(inputs):
    from ..ops import loglinear_attention

    x = inputs
    return loglinear_attention(x["q"], x["k"], x["v"], x["level_scales"], x["log_decay"], x["beta"], form="chunkwise",
                               chunk_size=16)


def fla_gated_delta_rule(inputs):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    x = inputs
    return chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["log_decay"], x["beta"], scale=1.0)[0]


def fla_simple_gla(inputs):
    from fla.ops.simple_gla import chunk_simple_gla

    x = inputs
    q, k = x["q_heads"]
    return chunk_simple_gla(q, k, x["v"], g=x["log_decay"], scale=1.0)[0]


DELTA_INPUTS = ("q", "k", "v", "level_scales", "log_decay", "beta")
IMPLEMENTATIONS = {  # name -> (function of the inputs, the inputs it differentiates)
    "loglinear (ours, triton)": (ours, ("q", "k", "v", "level_scales", "log_decay")),
    "loglinear (torch chunkwise)": (torch_chunkwise, ("q", "k", "v", "level_scales", "log_decay")),
    "mamba2 linear (ours, triton step 1)": (ours_linear, ("q", "k", "v", "log_decay")),
    "mamba2 linear (ours, triton chunk-parallel)": (ours_linear_parallel, ("q", "k", "v", "log_decay")),
    "sdpa (causal, flash on GPU)": (sdpa, ("sdpa",)),
    "fla chunk_log_linear_attn": (fla_loglinear, ("q", "k", "v", "level_scales", "log_decay")),
    "fla chunk_simple_gla (linear mamba2)": (fla_simple_gla, ("q_heads", "v", "log_decay")),
    "loglinear gated deltanet (ours, triton)": (ours_gated_deltanet, DELTA_INPUTS),
    "loglinear gated deltanet (torch chunkwise)": (torch_chunkwise_gated_deltanet, DELTA_INPUTS),
    "fla chunk_gated_delta_rule (linear gated deltanet)": (fla_gated_delta_rule, ("q", "k", "v", "log_decay", "beta")),
}
BY_MODEL = {  # the implementations run side by side for each model (settings.MODELS)
    "loglinear_mamba2": ("loglinear (ours, triton)", "loglinear (torch chunkwise)", "mamba2 linear (ours, triton step 1)",
                         "mamba2 linear (ours, triton chunk-parallel)", "sdpa (causal, flash on GPU)",
                         "fla chunk_log_linear_attn", "fla chunk_simple_gla (linear mamba2)"),
    "gated_deltanet": ("loglinear gated deltanet (ours, triton)", "loglinear gated deltanet (torch chunkwise)",
                       "fla chunk_gated_delta_rule (linear gated deltanet)", "sdpa (causal, flash on GPU)"),
}
CPU_ONLY = ("loglinear (torch chunkwise)", "loglinear gated deltanet (torch chunkwise)")
GPU_ONLY = ("fla chunk_log_linear_attn", "fla chunk_simple_gla (linear mamba2)",
            "fla chunk_gated_delta_rule (linear gated deltanet)")
