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
