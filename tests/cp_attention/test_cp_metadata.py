"""PackedBatch: padding decided from values, validation, plans and device placement."""

from __future__ import annotations

import pytest
import torch

from cp_attention import (
    PackedBatch,
    has_padding_by_identity,
    has_padding_by_value,
    pad_sequences_to_multiple,
)


def test_value_equal_clone_means_no_padding() -> None:
    cu = torch.tensor([0, 8, 12, 20], dtype=torch.int32)
    clone = cu.clone()
    assert not has_padding_by_value(cu, clone)
    # The detector being fixed: identity says "padded" for the same values.
    assert has_padding_by_identity(cu, clone)
    meta = PackedBatch.from_cu_seqlens(cu, clone, cp_size=2)
    assert not meta.has_padding and not meta.has_grad_tail


def test_tail_only_padding_is_padding() -> None:
    # Only the last entry differs: TE <= 2.17.1 compared cu_seqlens[:-1] and missed this.
    cu = [0, 8, 12, 19]
    cup = pad_sequences_to_multiple(cu, 4)
    assert cup == [0, 8, 12, 20]
    assert has_padding_by_value(cu, cup)
    meta = PackedBatch.from_cu_seqlens(cu, cup, cp_size=2)
    assert meta.has_padding and meta.has_grad_tail
    assert meta.max_seqlen == 8 and meta.max_seqlen_padded == 8


def test_padded_steps_never_read_padding_rows() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 8, 12, 19], [0, 8, 12, 20], cp_size=2)
    # Token 19 is the pad; under DualChunkSwap it is rank 0's back chunk of sequence 2.
    local_pad = int((meta.partition[0] == 19).nonzero())
    for call in meta.calls_for("p2p", True, 0):
        if call is not None and call.q_rows.index is not None:
            assert local_pad not in call.q_rows.index.tolist()
    first = meta.calls_for("p2p", True, 0)[0]
    assert first.cu_q.tolist()[-1] == meta.local_tokens - 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cu_seqlens": [0, 6, 12], "cp_size": 2}, "divisible by 2*cp=4"),
        ({"cu_seqlens": [0, 6, 12], "cp_size": 2, "strategy": "zigzag"},
         "dual_chunk_swap', 'no_load_balance'"),
        ({"cu_seqlens": [1, 6, 12], "cp_size": 2}, "cu_seqlens[0] must be 0"),
        ({"cu_seqlens": [0, 8, 4], "cp_size": 2}, "non-decreasing"),
        ({"cu_seqlens": [0, 8, 16], "cu_seqlens_padded": [0, 4, 16], "cp_size": 2},
         "sequence 0 has real length 8 but padded length 4"),
        ({"cu_seqlens": [0, 8, 16], "cu_seqlens_padded": [0, 16], "cp_size": 2}, "entries"),
        ({"cu_seqlens": [0, 5], "cp_size": 2, "strategy": "no_load_balance"}, "divisible by cp=2"),
        ({"cu_seqlens": [0, 8], "cp_size": 0}, "positive int"),
    ],
)
def test_bad_offsets_are_rejected_with_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        PackedBatch.from_cu_seqlens(**kwargs)
    assert message in str(info.value)


def test_device_tensor_offsets_are_refused() -> None:
    meta_device = torch.device("meta")
    with pytest.raises(ValueError, match="CPU tensor"):
        PackedBatch.from_cu_seqlens(torch.zeros(3, device=meta_device), cp_size=1)


def test_unknown_comm_lists_options() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 8], cp_size=2)
    with pytest.raises(ValueError, match="'p2p', 'all_gather'"):
        meta.calls_for("ring", True, 0)


def test_metadata_is_frozen_and_moves_once() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 8, 16], cp_size=2)
    with pytest.raises(AttributeError):
        meta.has_padding = True  # type: ignore[misc]
    moved = meta.to("cpu")
    assert moved.device == torch.device("cpu")
    assert moved.calls_for("p2p", True, 1)[0].cu_q.dtype == torch.int32


def test_no_padding_reference_plan_uses_slices_and_half_indices() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 8192, 12288, 14336, 16384], cp_size=2)
    diag, rest = meta.calls_for("p2p", True, 0)
    assert diag.q_rows.index is None and diag.k_rows.index is None and diag.causal
    assert diag.max_q == 4096 and diag.square
    # Rank 0, step 1 holds rank 1's KV: only our back halves attend to it, non-causally.
    assert rest.q_rows.count == 4096 and rest.k_rows.index is None and not rest.causal
    assert (rest.q_chunks, rest.k_chunks) == (1, 2)
