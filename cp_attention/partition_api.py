"""Partitioning of inputs and labels for a CP rank, driven by a :class:`PackedBatch`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cp_attention.metadata import PackedBatch
from cp_attention.partition import gather_tokens, scatter_tokens
from cp_attention.ranges import phase


def partition_for_rank(x: torch.Tensor, meta: PackedBatch, rank: int) -> torch.Tensor:
    """This rank's tokens of a packed tensor ``[total_tokens, ...]`` (inputs, labels, masks).

    Uses the strategy the metadata was built with, so inputs and attention always agree.

    :raises ValueError: when ``x`` does not hold the batch's padded token count.
    """
    if x.shape[0] != meta.total_tokens:
        raise ValueError(
            f"tensor has {x.shape[0]} tokens but the batch has {meta.total_tokens} "
            "(cu_seqlens_padded[-1]); repack it with repack_padded first"
        )
    if not 0 <= rank < meta.cp_size:
        raise ValueError(f"rank must be in [0, {meta.cp_size}), got {rank}")
    with phase("partition"):
        return gather_tokens(x, meta.partition[rank])


def unpartition(parts: Sequence[torch.Tensor], meta: PackedBatch) -> torch.Tensor:
    """Reassemble the packed tensor from every rank's part (tests, debugging, labels)."""
    if len(parts) != meta.cp_size:
        raise ValueError(f"expected {meta.cp_size} parts, got {len(parts)}")
    with phase("partition"):
        return scatter_tokens(parts, meta.partition, meta.total_tokens)
