"""The local kernel interface on CPU: math kernel vs an independent reference, and selection."""

from __future__ import annotations

import pytest
import torch
from cp_reference import reference_attention

from cp_attention import varlen_bwd, varlen_fwd
from cp_attention.local_attention import get_backend


@pytest.mark.parametrize("causal", [True, False])
def test_math_kernel_matches_reference_with_gqa(causal: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    cu = (0, 5, 12, 20)
    q = torch.randn(20, 4, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(20, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(20, 4, 8, generator=gen, dtype=torch.float64)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    out, lse = varlen_fwd(q, k, v, cu_t, cu_t, 8, 8, causal)
    assert lse.shape == (20, 4)
    grads = varlen_bwd(dout, q, k, v, out, lse, cu_t, cu_t, 8, 8, causal)
    want = reference_attention(q, k, v, dout, cu, cu, causal)
    torch.testing.assert_close(out, want["out"])
    for got, name in zip(grads, ("dq", "dk", "dv"), strict=True):
        torch.testing.assert_close(got, want[name])


def test_bottom_right_causal_prefix() -> None:
    # 2 queries at the end of a 5-key sequence see keys 0..3 and 0..4.
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(5, 1, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(5, 1, 4, generator=gen, dtype=torch.float64)
    out, _ = varlen_fwd(q, k, v, torch.tensor([0, 2]), torch.tensor([0, 5]), 2, 5, True)
    scores = (q[:, 0] @ k[:, 0].T) * 0.5
    scores[0, 4] = float("-inf")
    torch.testing.assert_close(out[:, 0], torch.softmax(scores, -1) @ v[:, 0])


def test_backend_selection_errors_list_options() -> None:
    with pytest.raises(ValueError, match="'auto', 'math', 'flash', 'cudnn'"):
        get_backend(torch.device("cpu"), "triton")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        get_backend(torch.device("cpu"), "flash")
    assert get_backend(torch.device("cpu")).name == "math"
