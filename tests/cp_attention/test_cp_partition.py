"""Partitioning, padding helpers and token alignment."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cp_attention import (
    PackedBatch,
    pad_sequences_to_multiple,
    pad_to_multiple,
    partition_for_rank,
    repack_padded,
    unpartition,
)
from cp_attention.partition import ranges_to_index


def test_dual_chunk_swap_owns_chunks_r_and_2cp_minus_1_minus_r() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 8, 16], cp_size=2)
    tokens = torch.arange(16)
    assert partition_for_rank(tokens, meta, 0).tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert partition_for_rank(tokens, meta, 1).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]


def test_no_load_balance_is_a_contiguous_view() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 5, 12], cp_size=2, strategy="no_load_balance")
    x = torch.arange(12)
    part = partition_for_rank(x, meta, 1)
    assert part.tolist() == list(range(6, 12))
    assert part.data_ptr() == x[6:].data_ptr()  # narrow: no copy


@pytest.mark.parametrize("strategy", ["dual_chunk_swap", "no_load_balance"])
def test_unpartition_inverts_partition_for_labels(strategy: str) -> None:
    meta = PackedBatch.from_cu_seqlens([0, 16, 24, 48], cp_size=4, strategy=strategy)
    labels = torch.randint(0, 100, (48,))
    parts = [partition_for_rank(labels, meta, r) for r in range(4)]
    assert torch.equal(unpartition(parts, meta), labels)


def test_pad_sequences_and_repack() -> None:
    cu = [0, 3, 8]
    cup = pad_sequences_to_multiple(cu, 4)
    assert cup == [0, 4, 12]
    x = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    assert repack_padded(x, cu, cup, fill=-100).tolist() == [1, 2, 3, -100, 4, 5, 6, 7, 8,
                                                             -100, -100, -100]


@pytest.mark.parametrize("multiple", [8, 16, 128])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_pad_to_multiple_aligns_every_rank_as_tail_padding(multiple: int, cp: int) -> None:
    cup = pad_to_multiple(pad_sequences_to_multiple([0, 3, 8], 2 * cp), multiple, cp_size=cp)
    meta = PackedBatch.from_cu_seqlens([0, 3, 8], cup, cp_size=cp)
    # What reaches each rank's FP8 GEMM is the local token count.
    assert meta.local_tokens % multiple == 0
    assert meta.has_padding and meta.total_tokens == cup[-1]
    for strategy in ("dual_chunk_swap", "no_load_balance"):
        PackedBatch.from_cu_seqlens([0, 3, 8], cup, cp_size=cp, strategy=strategy)


def test_pad_to_multiple_lists_valid_alignments() -> None:
    with pytest.raises(ValueError, match=r"\(8, 16, 128\)"):
        pad_to_multiple([0, 8], 12)


def test_partition_rejects_wrong_token_count() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 8], cp_size=2)
    with pytest.raises(ValueError, match="7 tokens but the batch has 8"):
        partition_for_rank(torch.zeros(7), meta, 0)


def test_ranges_to_index_is_vectorized_concat() -> None:
    got = ranges_to_index(np.array([5, 0, 9]), np.array([2, 0, 3]))
    assert got.tolist() == [5, 6, 9, 10, 11]
