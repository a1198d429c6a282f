"""GPU checks (skipped without CUDA): NCCL correctness script and the TE adapter vs TE."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cp_attention import PackedBatch, partition_for_rank

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_correctness_script_passes() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "NCCL_NVLS_ENABLE": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_correctness.py")],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert "RESULT: PASS" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available()
                    or importlib.util.find_spec("transformer_engine") is None,
                    reason="needs CUDA and transformer_engine")
def test_adapter_matches_te_without_cp() -> None:
    import transformer_engine.pytorch as te

    from cp_attention.te_adapter import AdaptedDotProductAttention

    device = torch.device("cuda")
    cu = [0, 256, 384, 512]
    meta = PackedBatch.from_cu_seqlens(cu, cp_size=1, device=device)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(512, 8, 128, generator=gen).to(device, torch.bfloat16)
               for _ in range(3))
    q, k, v = (partition_for_rank(t, meta, 0) for t in (q, k, v))
    kwargs = {"qkv_format": "thd", "attn_mask_type": "padding_causal"}
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    # Stock TE on its fast path (one object for padded and unpadded): without CP its padded THD
    # path has no backend on H200 for these inputs ("No dot product attention backend").
    want = te.DotProductAttention(8, 128, **kwargs)(
        q, k, v, cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t, cu_seqlens_q_padded=cu_t,
        cu_seqlens_kv_padded=cu_t, max_seqlen_q=256, max_seqlen_kv=256)
    got = AdaptedDotProductAttention(8, 128, **kwargs)(q, k, v, packed_batch=meta)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
