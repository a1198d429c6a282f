"""Independent float64 reference: per-sequence softmax attention with autograd, no CP."""

from __future__ import annotations

import math

import torch


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
    cu_seqlens: tuple[int, ...], cu_seqlens_padded: tuple[int, ...], causal: bool,
) -> dict[str, torch.Tensor]:
    """Out and grads over the padded buffer; padding rows have zero output and gradient."""
    q, k, v = (t.detach().double().clone().requires_grad_() for t in (q, k, v))
    out = torch.zeros_like(q)
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5
    for i in range(len(cu_seqlens) - 1):
        start = cu_seqlens_padded[i]
        n = cu_seqlens[i + 1] - cu_seqlens[i]
        if n == 0:
            continue
        qs = q[start : start + n]
        ks = k[start : start + n].repeat_interleave(group, 1)
        vs = v[start : start + n].repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if causal:
            mask = torch.ones(n, n, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, -math.inf)
        probs = torch.softmax(scores, -1)
        rows = (torch.arange(start, start + n),)
        out = out.index_put(rows, torch.einsum("hqk,khd->qhd", probs, vs))
    out.backward(dout.double())
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
