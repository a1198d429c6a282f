"""TE adapter without TE, and the profiler ranges every phase opens."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from cp_attention import PackedBatch, cp_attn, partition_for_rank
from cp_attention.ranges import phase
from cp_attention.te_adapter import (
    AdaptedDotProductAttention,
    TransformerEngineUnavailable,
    te_thd_kwargs,
)


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="TE installed: construction succeeds")
def test_adapter_imports_without_te_and_explains_on_construction() -> None:
    with pytest.raises(ImportError, match="transformer_engine"):
        AdaptedDotProductAttention(16, 128, qkv_format="thd")
    assert issubclass(TransformerEngineUnavailable, ImportError)


def test_adapter_passes_one_object_when_values_are_equal() -> None:
    meta = PackedBatch.from_cu_seqlens(torch.tensor([0, 8, 16]), torch.tensor([0, 8, 16]),
                                       cp_size=2)
    kw = te_thd_kwargs(meta)
    assert kw["cu_seqlens_q_padded"] is kw["cu_seqlens_q"]
    assert kw["pad_between_seqs"] is False


def test_adapter_keeps_tail_padding() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 8, 15], [0, 8, 16], cp_size=2)
    kw = te_thd_kwargs(meta)
    assert kw["pad_between_seqs"] is True
    assert kw["cu_seqlens_q_padded"].tolist() == [0, 8, 16]


def test_unknown_phase_is_rejected() -> None:
    with pytest.raises(ValueError, match="valid phases"), phase("attn"):
        pass


def test_single_rank_step_opens_named_ranges() -> None:
    meta = PackedBatch.from_cu_seqlens([0, 4, 8], cp_size=1)
    q, k, v = (partition_for_rank(torch.randn(8, 2, 4), meta, 0).requires_grad_()
               for _ in range(3))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        cp_attn(q, k, v, meta, broken_always_zero_fill=True).sum().backward()
    names = {e.name for e in prof.events()}
    for expected in ("cp_attention.attn_fwd_step", "cp_attention.attn_bwd_step",
                     "cp_attention.merge", "cp_attention.grad_zero_fill"):
        assert expected in names


def test_decision_from_caller_tensors_uses_values() -> None:
    from cp_attention.te_adapter import _decide_from_tensors

    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    same = _decide_from_tensors({"cu_seqlens_q": cu, "cu_seqlens_q_padded": cu.clone(),
                                 "cu_seqlens_kv": cu, "cu_seqlens_kv_padded": cu.clone()})
    assert same["cu_seqlens_q_padded"] is cu and same["pad_between_seqs"] is False
    tail = torch.tensor([0, 8, 15], dtype=torch.int32)
    padded = _decide_from_tensors({"cu_seqlens_q": tail, "cu_seqlens_q_padded": cu,
                                   "cu_seqlens_kv": tail, "cu_seqlens_kv_padded": cu})
    assert padded == {"pad_between_seqs": True}
    # An explicit caller choice is respected.
    assert "pad_between_seqs" not in _decide_from_tensors(
        {"cu_seqlens_q": tail, "cu_seqlens_q_padded": cu, "pad_between_seqs": True})


def test_range_names_match_the_te_catalog_helper_on_the_ab_path() -> None:
    from cp_attention.broken import TE_HELPER_RANGE, recompute_step_cu

    meta = PackedBatch.from_cu_seqlens([0, 8, 16], cp_size=2)
    call = meta.calls_for("p2p", True, 0)[1]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        redone = recompute_step_cu(call, meta, 0)
    names = [e.name for e in prof.events()]
    assert names.count(TE_HELPER_RANGE) == 2 and "cp_attention.metadata_step" in names
    # Whole-chunk calls use the device-recomputed offsets, which equal the planned ones.
    assert redone.cu_q is not call.cu_q and torch.equal(redone.cu_q, call.cu_q)
    assert torch.equal(redone.cu_k, call.cu_k)
