"""Bundled, fixed context-parallel attention for packed (THD) sequences.

Metadata is decided from values once per batch on the host (:class:`PackedBatch`), so the hot
loop launches no metadata kernels and never syncs; P2P ring and all-gather CP with DualChunkSwap
or NoLoadBalance partitioning; token alignment for FP8/FSDP; a Transformer Engine adapter in
:mod:`cp_attention.te_adapter`. See docs/cp_attention.md.
"""

from cp_attention.attention import CPConfig, cp_attn
from cp_attention.local_attention import varlen_bwd, varlen_fwd
from cp_attention.metadata import PackedBatch, has_padding_by_identity, has_padding_by_value
from cp_attention.partition import (
    pad_sequences_to_multiple,
    pad_to_multiple,
    repack_padded,
)
from cp_attention.partition_api import partition_for_rank, unpartition

__all__ = [
    "CPConfig",
    "PackedBatch",
    "cp_attn",
    "has_padding_by_identity",
    "has_padding_by_value",
    "pad_sequences_to_multiple",
    "pad_to_multiple",
    "partition_for_rank",
    "repack_padded",
    "unpartition",
    "varlen_bwd",
    "varlen_fwd",
]
