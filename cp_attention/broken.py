"""Reproductions of Transformer Engine's slow paths, for A/B runs only (never the default).

* ``broken_identity_padding``: TE >= 2.18 decides "padding between sequences" by object
  identity, so a value-equal clone of ``cu_seqlens`` takes the padded path, which recomputes the
  per-rank ``cu_seqlens`` on the device twice per CP step (``get_cu_seqlens_on_cp_rank``).
  :func:`recompute_step_cu` launches that device arithmetic every step, as TE does. When the
  recomputed offsets equal the host-planned ones by construction (no padding, whole-chunk
  calls) they are the ones the kernel uses; otherwise they are computed and dropped. The numbers
  are the same either way; only time is lost.
* ``broken_always_zero_fill``: TE's THD backward zero-fills the gradient padding
  (``arange``/compare/masked assignment on dQ, dK, dV) even when nothing needs clearing.
  :func:`zero_fill_padding` does that; in the fixed path padding gradients are already zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cp_attention.metadata import PackedBatch
from cp_attention.plan import AttnCall
from cp_attention.ranges import named_range, phase

TE_HELPER_RANGE = "get_cu_seqlens_on_cp_rank"


def _cu_on_cp_rank(meta: PackedBatch, rank: int, chunks: int) -> torch.Tensor:
    """Device-side per-rank offsets from the full offsets (TE helper's arithmetic, eager)."""
    cu, cup = meta.cu_seqlens_tensor, meta.cu_seqlens_padded_tensor
    with phase("metadata_step"), named_range(TE_HELPER_RANGE):
        seqlens = cu[1:] - cu[:-1]
        padded = cup[1:] - cup[:-1]
        chunk = torch.div(padded, 2 * meta.cp_size, rounding_mode="floor")
        front = torch.clamp(seqlens - rank * chunk, min=0)
        front = torch.minimum(front, chunk)
        back = torch.clamp(seqlens - (2 * meta.cp_size - 1 - rank) * chunk, min=0)
        back = torch.minimum(back, chunk)
        real = front + back if chunks == 2 else chunk * chunks
        return F.pad(torch.cumsum(real, 0, dtype=torch.int32), (1, 0))


def recompute_step_cu(call: AttnCall, meta: PackedBatch, rank: int) -> AttnCall:
    """Recompute the step's Q and KV offsets on the device, TE-style (two helper calls)."""
    cu_q = _cu_on_cp_rank(meta, rank, call.q_chunks or 2)
    cu_k = _cu_on_cp_rank(meta, rank, call.k_chunks or 2)
    if call.q_chunks is None or call.k_chunks is None:
        return call
    return call.with_offsets(cu_q, cu_k)


def zero_fill_padding(grads: list[torch.Tensor], meta: PackedBatch, rank: int) -> None:
    """Clear the padding rows of local gradients on the device, whether or not any exist."""
    with phase("grad_zero_fill"):
        device = grads[0].device
        cup = meta.cu_seqlens_padded_tensor.long()
        seqlens = (meta.cu_seqlens_tensor[1:] - meta.cu_seqlens_tensor[:-1]).long()
        pos = torch.arange(meta.local_tokens, device=device)
        if meta.strategy == "no_load_balance":
            pos = pos + rank * meta.local_tokens
            seg = torch.searchsorted(cup[1:], pos, right=True)
            pad = (pos - cup[seg]) >= seqlens[seg]
        else:
            chunk = (cup[1:] - cup[:-1]) // (2 * meta.cp_size)
            local_cu = F.pad(torch.cumsum(2 * chunk, 0), (1, 0))
            seg = torch.searchsorted(local_cu[1:], pos, right=True)
            back = 2 * meta.cp_size - 1 - rank
            real = torch.minimum(torch.clamp(seqlens - rank * chunk, min=0), chunk)
            real += torch.minimum(torch.clamp(seqlens - back * chunk, min=0), chunk)
            pad = (pos - local_cu[seg]) >= real[seg]
        for grad in grads:
            grad.masked_fill_(pad.view(-1, 1, 1), 0)
