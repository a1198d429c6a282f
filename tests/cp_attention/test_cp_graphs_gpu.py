"""CUDA-graph CP steps on one GPU: the graph path equals the eager path (CUDA only).

Every rank of cp = 2, 4 (and 8 for one pack) runs its local work (loopback ring) eagerly and
from a captured graph, on padded packs like the kernel checks' (many short sequences, length-1
sequences, tail padding, pads of 128 and 256, head dims 64/128/256, GQA), with the cuDNN and
the flash kernel. Outputs and gradients must be bitwise equal, with one exception: torch's
flash backward (FlashAttention-2) accumulates dQ across key blocks with float32 atomics, so its
dQ is not reproducible even eagerly (seen on H200: 3.7e-9 apart between two runs of one
layer); there dQ must agree to within one bf16 rounding. The same holds for cuDNN's dQ where
two eager runs already differ (its backward also accumulates dQ in float32; seen on H200 with
the all-gather comm on the tail-padding pack, one bf16 rounding apart): out, dK and dV stay
bitwise everywhere. ``CP_GRAPHS_TABLE=<file>`` writes what each case measured, bitwise or not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from cp_loopback import local_parts, run_all_ranks

from cp_attention import PackedBatch, cp_attn, pad_sequences_to_multiple, pad_to_multiple
from cp_attention.attention import GRAPHS, Tuning
from cp_attention.graphs import StepGraphs
from cp_attention.local_attention import cudnn_available

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

_ROWS: list[str] = []


def _offsets(lengths: list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def _pack(name: str, cp: int) -> tuple[list[int], list[int], int, int, int]:
    """(cu_seqlens, cu_seqlens_padded, heads, kv_heads, dim) of a named pack for ``cp``."""
    gen = torch.Generator().manual_seed(7)
    short = _offsets(torch.randint(1, 41, (64,), generator=gen).tolist())
    between = _offsets([100, 200, 33, 77])
    if name == "many short sequences":
        return short, pad_sequences_to_multiple(short, 2 * cp), 8, 8, 128
    if name == "length-1 sequences":
        cu = _offsets([1, 1, 5, 1, 1])
        return cu, pad_sequences_to_multiple(cu, 2 * cp), 8, 8, 128
    if name == "tail padding":
        cu = _offsets([500, 277])
        return cu, pad_to_multiple(pad_sequences_to_multiple(cu, 2 * cp), 128, cp_size=cp), 8, \
            8, 128
    if name == "pads of 128, head dim 64":
        return between, pad_sequences_to_multiple(between, 128), 8, 8, 64
    if name == "pads of 256, head dim 256, GQA 8/2":
        return between, pad_sequences_to_multiple(between, 256), 8, 2, 256
    raise ValueError(name)


PACKS = ["many short sequences", "length-1 sequences", "tail padding",
         "pads of 128, head dim 64", "pads of 256, head dim 256, GQA 8/2"]
CASES = [(p, cp) for p in PACKS for cp in (2, 4)] + [("many short sequences", 8)]


def _write_table() -> None:
    path = os.environ.get("CP_GRAPHS_TABLE")
    if path:
        head = ["| kernel | comm | pack | cp | forward bitwise | grads bitwise | eager run-to-run "
                "max diff (dq, dk, dv) | graph vs eager max diff (dq, dk, dv) |",
                "|---|---|---|---|---|---|---|---|"]
        Path(path).write_text("\n".join(head + _ROWS) + "\n")


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _assert_same(name: str, got: torch.Tensor, want: torch.Tensor, kernel: str,
                 eager_reproducible: bool = True) -> None:
    """Bitwise, except a dQ summed with float32 atomics (flash always; cuDNN where two eager
    runs already differ): one bf16 rounding of the same float32 sum."""
    if name == "dq" and (kernel == "flash" or not eager_reproducible):
        torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=1e-6)
    else:
        assert torch.equal(got, want), f"{name}: graph vs eager {_max_diff(got, want):.2e}"


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
@pytest.mark.parametrize(("pack", "cp"), CASES)
def test_graph_path_equals_eager_path(kernel: str, pack: str, cp: int, comm: str) -> None:
    if kernel == "cudnn" and not cudnn_available():
        pytest.skip("nvidia-cudnn-frontend does not import")
    cu, cup, heads, kv_heads, dim = _pack(pack, cp)
    meta = PackedBatch.from_cu_seqlens(cu, cup, cp_size=cp, device="cuda")
    gen = torch.Generator().manual_seed(cp)
    full = {n: torch.randn(cup[-1], h, dim, generator=gen).to("cuda", torch.bfloat16)
            for n, h in (("q", heads), ("k", kv_heads), ("v", kv_heads), ("dout", heads))}
    local = local_parts(meta, full)
    eager = [run_all_ranks(meta, full, True, Tuning(), kernel, local=local, comm=comm)
             for _ in range(2)]
    graphs = StepGraphs(capacity=64)
    graphed = [run_all_ranks(meta, full, True, Tuning(), kernel, graphs, local, comm)
               for _ in range(3)]  # capture + replay, then two more replays
    assert graphs.stats.captures == cp and not graphs.failed, graphs.failed
    assert graphs.stats.replays == 3 * cp
    fwd_bitwise = all(torch.equal(g["out"], eager[0]["out"]) for g in graphed)
    grads = ("dq", "dk", "dv")
    noise = [_max_diff(eager[0][n], eager[1][n]) for n in grads]
    diff = [max(_max_diff(g[n], eager[0][n]) for g in graphed) for n in grads]
    bitwise = all(torch.equal(g[n], eager[0][n]) for g in graphed for n in grads)
    _ROWS.append(f"| {kernel} | {comm} | {pack} | {cp} | {fwd_bitwise} | {bitwise} | "
                 f"{', '.join(f'{x:.1e}' for x in noise)} | "
                 f"{', '.join(f'{x:.1e}' for x in diff)} |")
    _write_table()
    assert fwd_bitwise, "forward output differs between the graph and the eager path"
    for g in graphed:
        for name, eager_noise in zip(grads, noise, strict=True):
            _assert_same(name, g[name], eager[0][name], kernel, eager_noise == 0.0)


@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
def test_cp_attn_graphs_equal_eager_over_layers_of_one_layout(kernel: str) -> None:
    """Two layers of one layout share the forward and the backward graph; results are cloned
    out of the graphs, so the second layer's replay does not overwrite the first's."""
    if kernel == "cudnn" and not cudnn_available():
        pytest.skip("nvidia-cudnn-frontend does not import")
    cu = _offsets([300, 129, 64, 1])
    meta = PackedBatch.from_cu_seqlens(cu, pad_sequences_to_multiple(cu, 128), cp_size=1,
                                       device="cuda")
    gen = torch.Generator().manual_seed(1)
    layers = [[torch.randn(meta.total_tokens, 8, 128, generator=gen).to("cuda", torch.bfloat16)
               for _ in range(4)] for _ in range(2)]
    before = (GRAPHS.stats.captures, GRAPHS.stats.replays)
    results = {}
    for mode in ("eager", "graphs", "graphs again"):
        leaves = [[t.clone().requires_grad_() for t in layer[:3]] for layer in layers]
        outs = [cp_attn(*lv, meta, backend=kernel, graphs=mode.startswith("graphs"))
                for lv in leaves]
        torch.autograd.backward(outs, [layer[3] for layer in layers])
        results[mode] = [t for o, lv in zip(outs, leaves, strict=True)
                         for t in (o.detach(), *(x.grad for x in lv))]
    assert GRAPHS.stats.captures - before[0] == 2  # one forward and one backward graph
    assert GRAPHS.stats.replays - before[1] == 8
    for mode in ("graphs", "graphs again"):
        for i, (got, want) in enumerate(zip(results[mode], results["eager"], strict=True)):
            _assert_same(("out", "dq", "dk", "dv")[i % 4], got, want, kernel)


@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
def test_eager_step_is_captured_inside_the_callers_graph(kernel: str) -> None:
    """The eager step is graph-safe: ``make_graphed_callables`` of the caller's module captures
    cp_attn's forward and backward (with graphs=True it runs eagerly inside the capture)."""
    if kernel == "cudnn" and not cudnn_available():
        pytest.skip("nvidia-cudnn-frontend does not import")
    cu = _offsets([200, 56])
    meta = PackedBatch.from_cu_seqlens(cu, pad_sequences_to_multiple(cu, 128), cp_size=1,
                                       device="cuda")

    class Attention(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return cp_attn(q, k, v, meta, backend=kernel, graphs=True)

    gen = torch.Generator().manual_seed(2)
    q, k, v, dout = (torch.randn(meta.total_tokens, 4, 128, generator=gen)
                     .to("cuda", torch.bfloat16) for _ in range(4))
    sample = tuple(t.clone().requires_grad_() for t in (q, k, v))
    nested = GRAPHS.stats.nested
    graphed = torch.cuda.make_graphed_callables(Attention(), sample)
    assert GRAPHS.stats.nested > nested
    got_in = [t.clone().requires_grad_() for t in (q, k, v)]
    got = graphed(*got_in)
    got.backward(dout)
    want_in = [t.clone().requires_grad_() for t in (q, k, v)]
    want = cp_attn(*want_in, meta, backend=kernel)
    want.backward(dout)
    assert torch.equal(got, want)
    for a, b in zip(got_in, want_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not cudnn_available(), reason="nvidia-cudnn-frontend does not import")
def test_graph_run_exits_without_nanobind_leak_lines() -> None:
    """Captured graphs go before the cuDNN graphs at exit: no ``nanobind: leaked`` lines."""
    code = textwrap.dedent("""
        import torch
        from cp_attention import PackedBatch, cp_attn
        meta = PackedBatch.from_cu_seqlens([0, 256, 384], cp_size=1, device="cuda")
        for _ in range(3):
            q, k, v = (torch.randn(384, 4, 128, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            cp_attn(q, k, v, meta, backend="cudnn", graphs=True).sum().backward()
        torch.cuda.synchronize()
        from cp_attention.attention import GRAPHS
        assert GRAPHS.stats.captures == 2 and GRAPHS.stats.replays == 6, GRAPHS.stats
        print("ran")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-3000:]
    assert "leaked" not in done.stderr, done.stderr[-3000:]
