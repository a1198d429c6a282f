"""Single-GPU checks of the local kernels (``cudnn``, ``flash``) against float64 (CUDA only).

The cases are :func:`cp_attention.kernel_check.cases`: hand-made packs (padding between
sequences, tail padding, one sequence, length-1 and many short sequences, GQA, head dims
64/128/256, causal and not) and every per-step block shape of the cp = 2, 4, 8 plans under
DualChunkSwap and NoLoadBalance. Each kernel runs packed and, where it can, in place, forward
and backward (out, LSE, dQ, dK, dV). With ``CP_KERNEL_TABLE=<path>`` the full table, with the
versions, is written there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cp_attention import kernel_check
from cp_attention.local_attention import cudnn_available, get_backend

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = kernel_check.cases() if torch.cuda.is_available() else []
GROUPS = sorted({c.group for c in CASES}, key=lambda g: (g != "packs", g))
KERNELS = ["flash", "cudnn", "cudnn_autotune"]
_ROWS: list = []


def _write_table() -> None:
    """Rewrite the table after every group, so a run cut short still leaves its rows."""
    path = os.environ.get("CP_KERNEL_TABLE")
    if path and _ROWS:
        head = [f"- {k}: {v}" for k, v in kernel_check.versions().items()]
        head.append(f"- cuDNN graphs by engine: {dict(kernel_check.engines_used())}")
        lines = [*head, "", *kernel_check.summary(_ROWS), "", *kernel_check.table(_ROWS)]
        Path(path).write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("kernel_name", KERNELS)
@pytest.mark.parametrize("group", GROUPS or ["none"])
def test_local_kernel_matches_float64(group: str, kernel_name: str) -> None:
    if kernel_name.startswith("cudnn") and not cudnn_available():
        pytest.skip("nvidia-cudnn-frontend does not import")
    device = torch.device("cuda")
    kernel = get_backend(device, kernel_name)
    rows = []
    # cudnn also with a float32 dQ (packed and in place); the autotuner only as before.
    layouts = (kernel_check.layouts_for(kernel) if kernel_name == "cudnn"
               else ("packed", "in place"))
    for case in (c for c in CASES if c.group == group):
        rows.extend(kernel_check.run_case(case, kernel, device, torch.bfloat16, layouts))
    _ROWS.extend(rows)
    _write_table()
    failed = [f"{r.case} [{r.layout}]: {r.errors} {r.error}" for r in rows if not r.ok]
    assert rows and not failed, "\n".join(failed[:20])


@pytest.mark.skipif(not cudnn_available(), reason="nvidia-cudnn-frontend does not import")
def test_cudnn_process_exit_prints_no_leak_warnings() -> None:
    """Cached cuDNN graphs are released at exit: no ``nanobind: leaked`` lines."""
    code = textwrap.dedent("""
        import torch
        from cp_attention import PackedBatch, cp_attn
        meta = PackedBatch.from_cu_seqlens([0, 256, 384], cp_size=1, device="cuda")
        q, k, v = (torch.randn(384, 4, 128, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        cp_attn(q, k, v, meta, backend="cudnn").sum().backward()
        torch.cuda.synchronize()
        from cp_attention.local_attention import get_backend
        assert get_backend(q.device, "cudnn").primary.engines, "no cuDNN graph was cached"
        print("ran")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-3000:]
    assert "leaked" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("indexed", [False, True])
def test_fused_merge_matches_eager_merge(in_place: bool, indexed: bool) -> None:
    from cp_attention import fused
    from cp_attention.merge import OutputMerger
    from cp_attention.plan import Rows

    if not fused.available():
        pytest.skip("triton does not import")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(3)
    tokens, heads, dim = 1000, 16, 128
    q = torch.empty(tokens, heads, dim, device=device, dtype=torch.bfloat16)
    first_out = torch.randn(tokens, heads, dim, device=device, generator=gen).bfloat16()
    first_lse = torch.randn(tokens, heads, device=device, generator=gen) * 3
    index = torch.randperm(tokens, device=device, generator=gen)[:357].sort().values
    rows = Rows(0, 357, index) if indexed else Rows(100, 457)
    n_step = tokens if in_place else 357
    step_out = torch.randn(n_step, heads, dim, device=device, generator=gen).bfloat16()
    # A transposed LSE view, as the flash kernel returns it.
    step_lse = (torch.randn(heads, n_step, device=device, generator=gen) * 3).transpose(0, 1)
    merged = []
    for use_fused in (False, True):
        m = OutputMerger(q, fused=use_fused)
        m.add(Rows(0, tokens), first_out.clone(), first_lse.clone())
        m.add(rows, step_out, step_lse, in_place)
        merged.append(m.result())
    (eager_out, eager_lse), (fused_out, fused_lse) = merged
    torch.testing.assert_close(fused_lse, eager_lse, rtol=1e-6, atol=1e-6)
    # One bf16 rounding of the same float32 value: at most one ulp apart.
    torch.testing.assert_close(fused_out.float(), eager_out.float(), rtol=8e-3, atol=1e-5)


@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("add", [False, True])
def test_fused_gather_rows_matches_eager(indexed: bool, add: bool) -> None:
    from cp_attention import fused
    from cp_attention.merge import gather_rows

    if not fused.available():
        pytest.skip("triton does not import")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(5)
    src = torch.randn(700, 8, 128, device=device, generator=gen).bfloat16()
    other = torch.randn(500, 8, 128, device=device, generator=gen).bfloat16() if add else None
    src_index = torch.randint(-1, 700, (300,), device=device, generator=gen)
    out_index = (torch.randperm(500, device=device, generator=gen)[:300] if indexed else None)
    got = []
    for use_fused in (False, True):
        out = torch.full((500, 8, 128), 3.0, device=device, dtype=torch.bfloat16)
        gather_rows(out, out_index, src, src_index, other, fused=use_fused)
        got.append(out)
    assert torch.equal(got[0], got[1])


@pytest.mark.parametrize("sources", [1, 2])
def test_fused_gather_sum_matches_eager(sources: int) -> None:
    """The one-pass dK/dV way back of the all-gather comm (rows of two sources summed, a
    negative index reading nothing: NaN there must not leak) equals the eager sum bit for bit
    (same float32 sum of two terms, one rounding)."""
    from cp_attention import fused
    from cp_attention.merge import gather_sum

    if not fused.available():
        pytest.skip("triton does not import")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(13)
    parts = []
    for _ in range(sources):
        src = torch.randn(800, 4, 128, device=device, generator=gen).bfloat16()
        index = torch.randint(-1, 800, (600,), device=device, generator=gen)
        src[~torch.isin(torch.arange(800, device=device), index)] = float("nan")
        parts.append((src, index))
    got = []
    for use_fused in (False, True):
        out = torch.full((600, 4, 128), 3.0, device=device, dtype=torch.bfloat16)
        gather_sum(out, parts, fused=use_fused)
        got.append(out)
    assert not bool(got[1].isnan().any())
    assert torch.equal(got[0], got[1])


@pytest.mark.parametrize("count", [1, 2, 4, 6])
def test_fused_sum_parts_matches_eager(count: int) -> None:
    """The one-kernel dQ sum (whole, ranged and indexed parts, float32 and bf16, more parts
    than one launch takes) equals the eager sum: same float32 arithmetic, one rounding."""
    from cp_attention import fused
    from cp_attention.merge import sum_parts
    from cp_attention.plan import Rows

    if not fused.available():
        pytest.skip("triton does not import")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(11)
    like = torch.empty(900, 16, 128, device=device, dtype=torch.bfloat16)
    index = torch.randperm(900, device=device, generator=gen)[:300].sort().values
    selections = [None, Rows(100, 700), Rows(0, 300, index), None, Rows(450, 900),
                  Rows(0, 300, index)]
    parts = []
    for i in range(count):
        t = torch.randn(like.shape, device=device, generator=gen,
                        dtype=torch.float32 if i % 3 != 1 else torch.bfloat16)
        rows = selections[i]
        if rows is not None:  # garbage outside the selection must never be read
            keep = torch.zeros(900, dtype=torch.bool, device=device)
            if rows.index is None:
                keep[rows.start : rows.stop] = True
            else:
                keep[rows.index] = True
            t[~keep] = float("nan")
        parts.append((t, rows, {}))
    eager = sum_parts(parts, like, fused=False)
    got = sum_parts(parts, like, fused=True)
    assert got.dtype == torch.bfloat16 and not bool(got.isnan().any())
    # Same float32 sum up to the summation order (pre-summed groups of four): one bf16 ulp.
    torch.testing.assert_close(got.float(), eager.float(), rtol=8e-3, atol=1e-5)


@pytest.mark.skipif(not cudnn_available(), reason="nvidia-cudnn-frontend does not import")
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("strategy", ["dual_chunk_swap", "no_load_balance"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("variant", ["default", "day1", "joint", "dq_fp32", "all_gather"])
def test_every_rank_of_a_cp_plan_with_cudnn_matches_float64(cp: int, strategy: str,
                                                            causal: bool, variant: str) -> None:
    """All ranks' local work (in place, fused merge, remote dK/dV added by rows, dQ added by
    rows; ``day1``: without dQ by rows; ``joint``: with DualChunkSwap rank cp-1's one-call
    backward; ``dq_fp32``: float32 dQ from cuDNN, summed once; ``all_gather``: the all-gather
    comm's one or two calls over the sequence-ordered KV) on one GPU, reassembled,
    against the float64 reference; padding rows exactly zero."""
    from cp_loopback import run_all_ranks
    from cp_reference import reference_attention

    from cp_attention import PackedBatch, pad_sequences_to_multiple
    from cp_attention.attention import Tuning

    cu = (0, 300, 429, 493, 494)
    cup = pad_sequences_to_multiple(cu, 2 * cp)
    meta = PackedBatch.from_cu_seqlens(cu, cup, cp_size=cp, strategy=strategy, device="cuda")
    gen = torch.Generator().manual_seed(cp + 10 * causal)
    full = {n: torch.randn(cup[-1], h, 128, generator=gen).to("cuda", torch.bfloat16)
            for n, h in (("q", 8), ("k", 4), ("v", 4), ("dout", 8))}
    tuning = {"default": Tuning(), "day1": Tuning(dq_rows=False),
              "joint": Tuning(joint_bwd=True), "dq_fp32": Tuning(dq_fp32=True),
              "all_gather": Tuning()}[variant]
    comm = "all_gather" if variant == "all_gather" else "p2p"
    got = run_all_ranks(meta, full, causal, tuning, backend="cudnn", comm=comm)
    want = reference_attention(*(full[n].cpu() for n in ("q", "k", "v", "dout")), cu,
                               tuple(cup), causal)
    for name in ("out", "dq", "dk", "dv"):
        err = float((got[name].cpu().double() - want[name]).abs().max() / want[name].abs().max())
        assert err < kernel_check.TOL, f"{name}: {err:.2e}"
    pad = torch.ones(cup[-1], dtype=torch.bool)
    for i in range(len(cu) - 1):
        pad[cup[i] : cup[i] + cu[i + 1] - cu[i]] = False
    for name in ("out", "dq", "dk", "dv"):
        assert bool((got[name][pad.cuda()] == 0).all()), f"{name} padding rows not zero"
