"""Float64 references written straight from the definitions (PAPER.md §1-§2), independent of the package.

Plain loops over (b, h, t, s): only for short sequences.
"""

import math

import numpy as np
import torch


def _np(x):
    return None if x is None else x.detach().double().numpy()


def loglinear_reference(q, k, v, level_scales=None, log_decay=None, beta=None) -> torch.Tensor:
    """o_t = Σ_{s<=t} A[t,s] exp(G_t - G_s) λ[t, level(t,s)] v_s, A from the delta rule if beta is given.

    q, k: [B, T, Hk, K] (Hk = H or 1), v: [B, T, H, V]; level_scales: [B, T, H, L] or None (λ ≡ 1).
    """
    q, k, v, lam, g, b = map(_np, (q, k, v, level_scales, log_decay, beta))
    B, T, H, V = v.shape
    out = np.zeros((B, T, H, V))
    for bi in range(B):
        for h in range(H):
            hk = h if q.shape[2] == H else 0
            for t in range(T):
                for s in range(t + 1):
                    key = k[bi, s, hk] * (1.0 if b is None else b[bi, s, h])
                    for r in range(s + 1, t + 1):  # Π_{r=s+1..t} (I - β_r k_r k_rᵀ), applied right to left
                        if b is not None:
                            key = key - b[bi, r, h] * k[bi, r, hk] * (k[bi, r, hk] @ key)
                    a = q[bi, t, hk] @ key
                    decay = 1.0 if g is None else math.exp(g[bi, s + 1 : t + 1, h].sum())
                    scale = 1.0 if lam is None else lam[bi, t, h, (t ^ s).bit_length()]
                    out[bi, t, h] += a * decay * scale * v[bi, s, h]
    return torch.from_numpy(out)


def softmax_reference(q, k, v, scale) -> torch.Tensor:
    """o_t = Σ_{s<=t} exp(scale q_t·k_s) v_s / Σ_{s<=t} exp(scale q_t·k_s)."""
    q, k, v = map(_np, (q, k, v))
    B, T, H, V = v.shape
    out = np.zeros((B, T, H, V))
    for bi in range(B):
        for h in range(H):
            hk = h if q.shape[2] == H else 0
            for t in range(T):
                w = np.exp([scale * q[bi, t, hk] @ k[bi, s, hk] for s in range(t + 1)])
                out[bi, t, h] = (w[:, None] * v[bi, : t + 1, h]).sum(0) / w.sum()
    return torch.from_numpy(out)
