"""Stock TE arms build their cu_seqlens per step, passed the way the variant says."""

from __future__ import annotations

import pytest
import torch

from runners.arms import te_cu_seqlens_kwargs
from runners.packing import build_layout
from runners.spec import Workload

CPU = torch.device("cpu")


def _kwargs_twice(metadata: str, seqlens: list[int]) -> tuple[dict, dict, tuple[int, ...]]:
    workload = Workload(metadata=metadata, seqlens=seqlens)  # type: ignore[arg-type]
    layout = build_layout(
        seqlens, ranks=2, strategy="dual_chunk_swap", metadata=metadata, token_alignment=None
    )
    first = te_cu_seqlens_kwargs(workload, layout, CPU)
    return first, te_cu_seqlens_kwargs(workload, layout, CPU), layout.cu_seqlens_padded


@pytest.mark.parametrize("metadata", ["same_object", "value_equal_clone", "real_padding"])
def test_each_step_gets_fresh_tensors(metadata: str) -> None:
    first, second, _ = _kwargs_twice(metadata, [8, 12, 4])
    # A training loop moves every batch's metadata: no tensor is reused across steps.
    assert all(first[key] is not second[key] for key in first)
    assert first["cu_seqlens_q"] is first["cu_seqlens_kv"]
    assert first["cu_seqlens_q_padded"] is first["cu_seqlens_kv_padded"]
    assert first["cu_seqlens_q"].dtype == torch.int32


def test_passing_modes_keep_their_identity_and_values() -> None:
    same, _, _ = _kwargs_twice("same_object", [8, 12, 4])
    assert same["cu_seqlens_q_padded"] is same["cu_seqlens_q"]
    clone, _, _ = _kwargs_twice("value_equal_clone", [8, 12, 4])
    assert clone["cu_seqlens_q_padded"] is not clone["cu_seqlens_q"]
    assert torch.equal(clone["cu_seqlens_q_padded"], clone["cu_seqlens_q"])
    padded, _, cu_padded = _kwargs_twice("real_padding", [8, 10, 3])
    assert padded["cu_seqlens_q"].tolist() == [0, 8, 18, 21]
    assert padded["cu_seqlens_q_padded"].tolist() == list(cu_padded) == [0, 8, 20, 24]
