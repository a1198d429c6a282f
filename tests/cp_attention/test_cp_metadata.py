"""PackedBatch: padding decided from values, validation, plans and device placement."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cp_attention import (
    PackedBatch,
    has_padding_by_identity,
    has_padding_by_value,
    pad_sequences_to_multiple,
)
from cp_attention.plan import Rows
from cp_attention.transfer import ALIGN_BYTES, to_device_packed


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


def _leaves_by_dtype(meta: PackedBatch) -> dict[torch.dtype, list[torch.Tensor]]:
    """Every tensor of the batch (partition, planned calls, TE offsets), grouped by dtype."""
    leaves = [p for p in meta.partition if isinstance(p, torch.Tensor)]
    for calls in meta.calls.values():
        for call in calls:
            if call is not None:
                rows = [r.index for r in (call.q_rows, call.k_rows) if r.index is not None]
                leaves += [*rows, call.cu_q, call.cu_k]
    leaves += [meta.cu_seqlens_tensor, meta.cu_seqlens_padded_tensor]
    grouped: dict[torch.dtype, list[torch.Tensor]] = {}
    for leaf in leaves:
        grouped.setdefault(leaf.dtype, []).append(leaf)
    return grouped


def test_packed_transfer_keeps_values_shapes_and_order() -> None:
    leaves = [
        torch.tensor([0, 8, 12], dtype=torch.int32),
        torch.arange(5, dtype=torch.int64),
        torch.tensor(7, dtype=torch.int32),  # 0-d
        torch.zeros(0, dtype=torch.int64),  # empty
        torch.arange(12, dtype=torch.int32).view(3, 4).t(),  # non-contiguous 2-d
        torch.zeros(0, 3, dtype=torch.int32),  # empty 2-d
        torch.tensor([-1, 2**40], dtype=torch.int64),
    ]
    moved = to_device_packed(leaves, "cpu")
    assert len(moved) == len(leaves)
    for before, after in zip(leaves, moved, strict=True):
        assert after.dtype == before.dtype and after.shape == before.shape
        assert torch.equal(after, before)
        # A fresh buffer, never the caller's storage (so the copy cannot alias host data).
        assert after.untyped_storage().data_ptr() != before.untyped_storage().data_ptr()
        assert after.storage_offset() * after.element_size() % ALIGN_BYTES == 0
    for dtype in (torch.int32, torch.int64):
        storages = {t.untyped_storage().data_ptr() for t in moved if t.dtype == dtype}
        assert len(storages) == 1, f"{dtype} leaves are spread over {len(storages)} buffers"


def test_packed_transfer_of_nothing_is_nothing() -> None:
    assert to_device_packed([], "cpu") == []


class _CopyCounter(TorchDispatchMode):
    """Counts device-changing copies (what becomes a host-to-device memcpy on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = kwargs.get("device")
        if func is torch.ops.aten._to_copy.default and target not in (None, args[0].device):
            self.copies.append(args[0].dtype)
        return func(*args, **kwargs)


@pytest.mark.parametrize("strategy", ["dual_chunk_swap", "no_load_balance"])
def test_batch_moves_with_one_copy_per_dtype(strategy: str) -> None:
    # Padded, cp=4: dozens of index/offset leaves (rows indices int64, cu_seqlens int32).
    cu = [0, 40, 56, 61, 90]
    meta = PackedBatch.from_cu_seqlens(
        cu, pad_sequences_to_multiple(cu, 8), cp_size=4, strategy=strategy
    )
    before = _leaves_by_dtype(meta)
    assert sum(len(v) for v in before.values()) > 20
    with _CopyCounter() as counter:
        moved = meta.to("meta")  # a real device change, without a GPU
    assert sorted(map(str, counter.copies)) == sorted(map(str, before))
    after = _leaves_by_dtype(moved)
    assert moved.device == torch.device("meta")
    for dtype, leaves in before.items():
        assert [t.shape for t in after[dtype]] == [t.shape for t in leaves]
        assert all(t.device.type == "meta" for t in after[dtype])


def test_moved_batch_is_value_equal_and_shares_one_buffer_per_dtype() -> None:
    cu = [0, 8, 12, 19]
    meta = PackedBatch.from_cu_seqlens(cu, pad_sequences_to_multiple(cu, 4), cp_size=2)
    moved = meta.to("cpu")
    before, after = _leaves_by_dtype(meta), _leaves_by_dtype(moved)
    assert set(after) == {torch.int32, torch.int64}
    for dtype, leaves in before.items():
        assert len(after[dtype]) == len(leaves)
        for old, new in zip(leaves, after[dtype], strict=True):
            assert new.shape == old.shape and torch.equal(new, old)
        storages = {t.untyped_storage().data_ptr() for t in after[dtype]}
        assert len(storages) == 1, f"{dtype} leaves are spread over {len(storages)} buffers"
    # Host values, flags and the plan's structure are untouched; backend caches start empty.
    assert (moved.cu_seqlens, moved.has_padding, moved.max_seqlen) == (
        meta.cu_seqlens, meta.has_padding, meta.max_seqlen
    )
    assert moved.calls.keys() == meta.calls.keys()
    for key, calls in meta.calls.items():
        for old, new in zip(calls, moved.calls[key], strict=True):
            assert (old is None) == (new is None)
            if old is not None:
                assert (new.max_q, new.max_k, new.causal, new.square) == (
                    old.max_q, old.max_k, old.causal, old.square
                )
                assert (new.q_rows.start, new.q_rows.stop) == (old.q_rows.start, old.q_rows.stop)
                assert new.cache == {}
    with pytest.raises(AttributeError):
        moved.cu_seqlens_tensor = meta.cu_seqlens_tensor  # type: ignore[misc]


def test_single_call_moves_as_one_buffer_per_dtype() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 8, 12, 19], [0, 8, 12, 20], cp_size=2)
    # A call that selects its query rows by index (the padding row is skipped).
    call = next(
        c for calls in meta.calls.values() for c in calls
        if c is not None and c.q_rows.index is not None
    )
    moved = call.to(torch.device("cpu"))
    assert torch.equal(moved.cu_q, call.cu_q) and torch.equal(moved.cu_k, call.cu_k)
    assert moved.cu_q.untyped_storage().data_ptr() == moved.cu_k.untyped_storage().data_ptr()
    assert moved.q_rows.index is not None
    assert torch.equal(moved.q_rows.index, call.q_rows.index)
    slice_rows = Rows(0, 4)
    assert slice_rows.to(torch.device("cpu")) is slice_rows
