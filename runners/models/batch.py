"""The packed batch a model trains on: seeded hidden states, partitioned for this CP rank.

Every rank draws the whole batch from the workload's seed and keeps its own partition, with the
partition the attention implementation expects (TE's THD indices for ``te_transformer``,
``cp_attention.partition_for_rank`` for ``torch_transformer``), so ranks agree on the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runners.arms import _DTYPES, RankContext, _metadata_tensors, _te_partition_index
from runners.packing import PackedLayout
from runners.spec import ModelSpec, Workload


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """This rank's rows of the packed batch (``[local tokens, hidden]``) and its offsets."""

    hidden_states: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    """Passed the way the variant's ``metadata`` says (same object, clone or really padded)."""
    max_seqlen: int


def packed_batch(
    model: ModelSpec, workload: Workload, layout: PackedLayout, ctx: RankContext
) -> PackedBatch:
    hidden = model.hidden or workload.heads * workload.head_dim
    gen = torch.Generator().manual_seed(workload.seed)
    full = torch.randn((layout.total_tokens, hidden), generator=gen) * 0.5
    cu, cu_padded = _metadata_tensors(workload, layout, ctx.device)
    if model.kind == "te_transformer" and ctx.world > 1:
        index = _te_partition_index(workload, cu_padded, layout.total_tokens, ctx)
        local = full.to(ctx.device).index_select(0, index)
    elif ctx.world > 1:
        from cp_attention import PackedBatch as Meta
        from cp_attention import partition_for_rank

        meta = Meta.from_cu_seqlens(
            list(layout.cu_seqlens), list(layout.cu_seqlens_padded), cp_size=ctx.world,
            strategy=workload.strategy,
        )
        local = partition_for_rank(full, meta, ctx.rank).to(ctx.device)
    else:
        local = full.to(ctx.device)
    sizes = [b - a for a, b in zip(layout.cu_seqlens_padded, layout.cu_seqlens_padded[1:],
                                   strict=False)]
    return PackedBatch(
        hidden_states=local.to(_DTYPES[workload.dtype]).contiguous(),
        cu_seqlens=cu,
        cu_seqlens_padded=cu_padded,
        max_seqlen=max(sizes),
    )
