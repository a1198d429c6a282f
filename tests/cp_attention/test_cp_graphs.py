"""The CUDA-graph cache of CP steps: keys, replays, re-captures, eviction and eager fallback.

On CPU no CUDA graph can be captured, so the real capture fails and every path must fall back
to the eager step with one WARNING line and identical numbers. The cache's own logic (what a
layout change or new tensors capture, what replays, what is copied, what is evicted) is
checked with a host capture: a recorded step replayed into fixed output buffers, which is what
a CUDA graph does with its kernels.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch
from cp_loopback import local_parts, run_all_ranks

from cp_attention import PackedBatch, cp_attn, pad_sequences_to_multiple
from cp_attention.attention import GRAPHS, Tuning
from cp_attention.graphs import (
    CapturedStep,
    GraphCaptureError,
    StepFn,
    StepGraphs,
    capture_cuda,
)

CU = (0, 13, 18, 40, 41)  # real lengths 13, 5, 22, 1


class HostGraph:
    """A step recorded once and replayed into the same output buffers (a CUDA graph's contract:
    static inputs read at replay, static outputs overwritten)."""

    def __init__(self, fn: StepFn, static: list[torch.Tensor]) -> None:
        self.fn, self.static = fn, static
        self.outputs = tuple(t.clone() for t in fn(static))
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for out, new in zip(self.outputs, self.fn(self.static), strict=True):
            out.copy_(new)


def host_capture(fn: StepFn, inputs: Sequence[torch.Tensor], bind: bool) -> CapturedStep:
    static = list(inputs) if bind else [t.clone() for t in inputs]
    graph = HostGraph(fn, static)
    return CapturedStep(graph, tuple(static), graph.outputs, keep=fn, bound=bind)


def _double(xs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (xs[0] * 2 + xs[1],)


def test_same_layout_replays_and_copies_inputs_into_the_static_buffers() -> None:
    graphs = StepGraphs(capture=host_capture)
    a, b = torch.ones(4), torch.arange(4.0)
    first = graphs.run("L", _double, [a, b])[0].clone()
    second = graphs.run("L", _double, [a * 3, b])[0]  # other tensors, same shapes: replay
    assert first.tolist() == [2.0, 3.0, 4.0, 5.0] and second.tolist() == [6.0, 7.0, 8.0, 9.0]
    assert (graphs.stats.captures, graphs.stats.replays, len(graphs)) == (1, 2, 1)
    assert a.tolist() == [1.0] * 4  # the caller's tensors are never written


def test_bound_inputs_capture_per_tensor_and_replay_without_copies() -> None:
    graphs = StepGraphs(capture=host_capture)
    a, b = torch.ones(4), torch.zeros(4)
    graphs.run("L", _double, [a, b], bind=True)
    a.fill_(5.0)  # the graph reads the caller's tensors themselves
    assert graphs.run("L", _double, [a, b], bind=True)[0].tolist() == [10.0] * 4
    graphs.run("L", _double, [torch.ones(4), b], bind=True)  # another tensor: its own graph
    assert (graphs.stats.captures, graphs.stats.layout_changes, len(graphs)) == (2, 0, 2)


def test_layout_change_recaptures_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    graphs = StepGraphs(capture=host_capture)
    x = [torch.ones(4), torch.ones(4)]
    with caplog.at_level(logging.INFO, logger="cp_attention.graphs"):
        graphs.run("L1", _double, x)
        graphs.run("L2", _double, x)
        graphs.run("L1", _double, x)
        graphs.run("L2", _double, [torch.ones(8), torch.ones(8)])  # new shapes, known layout
    assert (graphs.stats.captures, graphs.stats.layout_changes) == (3, 1)
    captured = [r.getMessage() for r in caplog.records if "captured CUDA graph" in r.getMessage()]
    assert len(captured) == 3 and "for a new layout" in captured[1]


def test_capacity_evicts_the_least_recently_used_graph() -> None:
    graphs = StepGraphs(capacity=2, capture=host_capture)
    x = [torch.ones(2), torch.ones(2)]
    for layout in ("A", "B", "A", "C"):  # B is the least recently used when C arrives
        graphs.run(layout, _double, x)
    assert graphs.stats.evictions == 1 and len(graphs) == 2
    graphs.run("A", _double, x)
    assert graphs.stats.captures == 3  # A still cached
    graphs.run("B", _double, x)
    assert graphs.stats.captures == 4
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        StepGraphs(capacity=0)


def test_capture_failure_runs_eagerly_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    def refuse(fn: StepFn, inputs: Sequence[torch.Tensor], bind: bool) -> CapturedStep:
        raise GraphCaptureError("operation not permitted when stream is capturing")

    graphs = StepGraphs(capture=refuse)
    x = [torch.ones(3), torch.ones(3)]
    with caplog.at_level(logging.WARNING, logger="cp_attention.graphs"):
        outs = [graphs.run("L", _double, x)[0] for _ in range(3)]
    assert all(o.tolist() == [3.0] * 3 for o in outs)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "capture failed" in warnings[0].getMessage()
    assert (graphs.stats.fallbacks, graphs.stats.captures) == (3, 0)


def test_capture_cuda_refuses_host_tensors() -> None:
    with pytest.raises(GraphCaptureError, match="one CUDA device"):
        capture_cuda(_double, [torch.ones(2), torch.ones(2)], False)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("strategy", ["dual_chunk_swap", "no_load_balance"])
def test_rank_local_work_through_graphs_equals_eager(cp: int, strategy: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Every rank's local work through the cache (host capture: the recorded step replayed
    with the ring's tensors bound) is bit-identical to the eager step, on replays too; the real
    capture on CPU falls back with one WARNING line and the same numbers."""
    cup = pad_sequences_to_multiple(CU, 2 * cp)
    meta = PackedBatch.from_cu_seqlens(CU, cup, cp_size=cp, strategy=strategy)
    gen = torch.Generator().manual_seed(cp)
    full = {n: torch.randn(cup[-1], h, 8, generator=gen, dtype=torch.float64)
            for n, h in (("q", 4), ("k", 2), ("v", 2), ("dout", 4))}
    want = run_all_ranks(meta, full, True, Tuning())
    local = local_parts(meta, full)
    recorded = StepGraphs(capacity=64, capture=host_capture)
    for _ in range(2):
        got = run_all_ranks(meta, full, True, Tuning(), graphs=recorded, local=local)
        assert all(torch.equal(got[n], want[n]) for n in want)
    assert (recorded.stats.captures, recorded.stats.replays) == (cp, 2 * cp)
    real = StepGraphs()
    with caplog.at_level(logging.WARNING, logger="cp_attention.graphs"):
        for _ in range(2):
            got = run_all_ranks(meta, full, True, Tuning(), graphs=real, local=local)
            assert all(torch.equal(got[n], want[n]) for n in want)
    assert real.stats.fallbacks == 2 * cp and real.stats.captures == 0
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == cp  # one per rank


def test_cp_attn_graphs_on_cpu_falls_back_with_identical_numbers(
        caplog: pytest.LogCaptureFixture) -> None:
    meta = PackedBatch.from_cu_seqlens(CU, pad_sequences_to_multiple(CU, 4), cp_size=1)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(meta.total_tokens, 4, 8, generator=gen, dtype=torch.float64)
               for _ in range(3))
    results = []
    before = GRAPHS.stats.fallbacks
    with caplog.at_level(logging.WARNING, logger="cp_attention.graphs"):
        for graphs in (False, True, True):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = cp_attn(*leaves, meta, graphs=graphs)
            out.backward(torch.ones_like(out))
            results.append([out.detach(), *(t.grad for t in leaves)])
    for got in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got, results[0], strict=True))
    assert GRAPHS.stats.fallbacks - before == 4  # forward and backward, twice
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
