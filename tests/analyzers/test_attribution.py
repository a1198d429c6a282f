"""Attribution on hand-built traces: precedence, nesting, graphs, threads, fallbacks."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from analyzers import attribution
from analyzers.attribution import MATCHED_BY_LABELS, RangeIndex, attribute, link_launches
from analyzers.catalog import builtin_catalog
from analyzers.model import RangeKind, Trace
from analyzers.readers import read_nsys
from tests.analyzers.factories import TraceBuilder

CATALOG = builtin_catalog()
CP_FWD = "transformer_engine.AttnFuncWithCPAndKVP2P.forward"
TE_CP_PY = "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py"
HELPER_RANGE = (
    "transformer_engine.pytorch.attention.dot_product_attention.context_parallel."
    "get_cu_seqlens_on_cp_rank"
)


NSYS_3ARMS = Path(__file__).resolve().parents[1] / "data/te-2.20.2-h200x2/nsys_3arms.sqlite.gz"


@pytest.fixture(scope="module")
def nsys_trace() -> Trace:
    return read_nsys(NSYS_3ARMS)


def _reference_links(trace: Trace) -> list[int]:
    """The join written the obvious way: a dict of (process, correlation) -> first launch row,
    then (rank, correlation) for activities whose process launches nothing."""
    by_process: dict[tuple[int, int], int] = {}
    by_rank: dict[tuple[int, int], int] = {}
    launches = trace.launches
    for row, (proc, rank, corr) in enumerate(
        zip(
            launches["process"].tolist(),
            launches["rank"].tolist(),
            launches["correlation"].tolist(),
            strict=True,
        )
    ):
        by_process.setdefault((proc, corr), row)
        if rank >= 0:
            by_rank.setdefault((rank, corr), row)
    launching = set(launches["process"].tolist())
    acts = trace.activities
    out = []
    for proc, rank, corr in zip(
        acts["process"].tolist(), acts["rank"].tolist(), acts["correlation"].tolist(), strict=True
    ):
        found = by_process.get((proc, corr), -1) if corr >= 0 else -1
        if found < 0 and corr >= 0 and proc not in launching and rank >= 0:
            found = by_rank.get((rank, corr), -1)
        out.append(found)
    return out


def test_link_launches_equals_reference_join_on_real_export(nsys_trace: Trace) -> None:
    links = link_launches(nsys_trace)
    assert links.tolist() == _reference_links(nsys_trace)
    assert (links >= 0).all()  # every kernel/memcpy/memset of the export has its launch


def test_link_launches_unsorted_duplicated_and_many_processes(
    nsys_trace: Trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shuffled launch rows (ids no longer sorted per process), the first 50 rows repeated at
    # the end (the first copy must win), and kernels moved to a device pid that launches
    # nothing (the rank fallback, as in Kineto traces).
    rng = np.random.default_rng(7)
    launches = nsys_trace.launches[rng.permutation(len(nsys_trace.launches))]
    launches = np.concatenate([launches, launches[:50]])
    acts = nsys_trace.activities.copy()
    acts["process"][::3] = 12345
    trace = dataclasses.replace(nsys_trace, activities=acts, launches=launches)
    expected = _reference_links(trace)
    assert link_launches(trace).tolist() == expected
    monkeypatch.setattr(attribution, "_GROUP_LOOP_LIMIT", 0)  # the many-process path
    assert link_launches(trace).tolist() == expected


def test_helper_ranges_each_claim_exactly_one_kernel_on_real_export(nsys_trace: Trace) -> None:
    att = attribute(nsys_trace, CATALOG)
    helper = CATALOG.index("get_cu_seqlens_on_cp_rank")
    claimed = Counter(att.range_row[att.helper == helper].tolist())
    assert len(claimed) == 256
    assert set(claimed.values()) == {1}


def _names(trace, attribution):
    return [attribution.name_of(int(h)) for h in attribution.helper]


def _how(attribution):
    return [MATCHED_BY_LABELS[int(m)] for m in attribution.matched_by]


def test_docstring_example_precedence() -> None:
    b = TraceBuilder(fmt="nsys")
    b.range(CP_FWD, 100, 900, kind=RangeKind.NVTX)
    b.range(HELPER_RANGE, 200, 300, kind=RangeKind.NVTX)
    b.range("aten::copy_", 400, 450, kind=RangeKind.CPU_OP)
    b.kernel(
        "triton_per_fused__to_copy_add_clamp_cumsum_floor_divide_mul_slice_sub_zeros_like_0",
        205,
        1000,
        5,
    )
    b.kernel("elementwise_kernel", 405, 1010, 5)
    b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 105, 1020, 50)
    b.kernel("Memcpy DtoD", None, 1100, 5, correlation=99)
    trace = b.build()
    att = attribute(trace, CATALOG)
    assert _names(trace, att) == [
        "get_cu_seqlens_on_cp_rank",
        "te_cp_forward",
        "cp_p2p_send_recv",
        "(unattributed)",
    ]
    assert _how(att) == ["range", "range", "kernel-name", "none"]
    assert att.launch.tolist() == [0, 1, 2, -1]


def test_innermost_catalogued_range_wins_and_ranges_beat_kernel_names() -> None:
    b = TraceBuilder()
    py = RangeKind.PYTHON
    b.range(
        TE_CP_PY + "(1587): forward",
        0,
        1000,
        kind=py,
    )
    b.range(
        "transformer_engine/pytorch/cpp_extensions/fused_attn.py(175): fused_attn_fwd",
        100,
        500,
        kind=py,
    )
    b.range("torch/foo.py(1): uncatalogued", 150, 400, kind=py)
    # An attention kernel launched inside a metadata helper belongs to the helper.
    b.range(
        TE_CP_PY + "(214): get_cu_seqlens_on_cp_rank",
        600,
        700,
        kind=py,
    )
    b.kernel("thd_read_half_tensor_kernel", 200, 2000, 10)
    b.kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_x", 650, 2100, 10)
    att = attribute(b.build(), CATALOG)
    assert _names(None, att) == ["te_fused_attn_fwd", "get_cu_seqlens_on_cp_rank"]
    assert _how(att) == ["python", "python"]


def test_cuda_graph_launch_attributes_every_node_and_autograd_thread() -> None:
    b = TraceBuilder()
    b.range("cp_attention.attn_bwd_step", 0, 100, thread=2)
    b.range("cp_attention.attn_fwd_step", 0, 100, thread=1)
    corr = b.kernel("k0", 10, 500, 3, thread=2, api="cudaGraphLaunch")
    for i in range(1, 4):  # more graph nodes, same correlation, no launch rows of their own
        b.kernel(f"k{i}", None, 500 + 10 * i, 3, correlation=corr)
    att = attribute(b.build(), CATALOG)
    assert _names(None, att) == ["cp_attention.attn_bwd_step"] * 4
    assert att.launch.tolist() == [0, 0, 0, 0]


def test_process_must_match_and_rank_fallback() -> None:
    b = TraceBuilder(fmt="nsys")
    b.range("cp_attention.merge", 0, 100, process=1, rank=0, thread=11)
    b.range("cp_attention.partition", 0, 100, process=2, rank=1, thread=21)
    # Same correlation id in two processes: each kernel joins its own process's launch.
    b.kernel("a", 10, 200, 1, process=1, rank=0, correlation=5, thread=11)
    b.kernel("b", 20, 200, 1, process=2, rank=1, correlation=5, thread=21)
    trace = b.build()
    att = attribute(trace, CATALOG)
    assert _names(trace, att) == ["cp_attention.merge", "cp_attention.partition"]
    # Kineto style: kernel pid is the device (never launches); join by rank instead.
    trace.activities["process"] = 0
    att = attribute(trace, CATALOG)
    assert _names(trace, att) == ["cp_attention.merge", "cp_attention.partition"]


def test_within_restricts_kernel_patterns_to_container() -> None:
    b = TraceBuilder()
    b.range("transformer_engine.AttnFuncWithCPAndKVP2P.backward", 0, 100, kind=RangeKind.NVTX)
    masked = "void at::native::elementwise_kernel<128, 4, masked_fill_kernel(...)>"
    b.kernel(masked, 10, 300, 2)
    b.kernel(masked, 200, 400, 2)  # outside the CP backward: stays unattributed
    att = attribute(b.build(), CATALOG)
    assert _names(None, att) == ["te_thd_grad_zero_fill_inline", "(unattributed)"]


def test_range_index_matches_stack_reference() -> None:
    rng = np.random.default_rng(0)
    b = TraceBuilder()
    for thread in (1, 2, 3):
        t = 0
        for _ in range(200):  # random nested forest: open/close pushes
            depth_spans = []
            start = t
            for d in range(int(rng.integers(1, 5))):
                depth_spans.append(start + d)
            end = start + 50
            for d, s in enumerate(depth_spans):
                b.range(f"r{d}", s, end - d, thread=thread)
            t = end + int(rng.integers(0, 3))
    trace = b.build()
    r = trace.ranges
    index = RangeIndex(r["thread"], r["start"], r["end"], np.arange(len(r)))
    threads = rng.integers(1, 5, 2000)
    times = rng.integers(0, int(r["end"].max()) + 10, 2000)
    got = index.lookup(threads, times)
    for th, tm, g in zip(threads, times, got, strict=True):
        inside = np.flatnonzero((r["thread"] == th) & (r["start"] <= tm) & (r["end"] > tm))
        expect = inside[np.argmax(r["depth"][inside])] if len(inside) else -1
        assert g == expect


@pytest.mark.parametrize("block", [1, 5, 1 << 40])  # a thread a block, several, one block
def test_range_index_built_in_blocks_equals_one_block(nsys_trace: Trace, block: int) -> None:
    """The index built in blocks of whole threads holds the arrays of the one-block build (a
    thread's keys, depths and parents are its own), on a real export's ranges in table order
    and on the same ranges shuffled (a thread's rows not adjacent)."""
    r = nsys_trace.ranges
    order = np.random.default_rng(1).permutation(len(r))
    for rows in (np.arange(len(r)), order):
        thread, start, end = (r[k][rows].astype(np.int64) for k in ("thread", "start", "end"))
        one = RangeIndex(thread, start, end, rows, block=1 << 62)
        blocked = RangeIndex(thread, start, end, rows, block=block)
        assert len(one.threads) > 1
        for name in ("threads", "rows", "key_start", "key_end", "thread_idx", "parent"):
            assert np.array_equal(getattr(one, name), getattr(blocked, name)), name
        probe = np.random.default_rng(2).integers(0, len(rows), 500)
        times = start[probe] + (end[probe] - start[probe]) // 2
        assert np.array_equal(
            one.lookup(thread[probe], times), blocked.lookup(thread[probe], times)
        )
    empty = np.empty(0, dtype=np.int64)
    assert len(RangeIndex(empty, empty, empty, empty, block=block).rows) == 0


def test_sliced_range_lookup_equals_one_pass(
    nsys_trace: Trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = attribute(nsys_trace, CATALOG)
    monkeypatch.setattr(attribution, "_LOOKUP_SLICE", 7)  # many slices, one ragged
    sliced = attribute(nsys_trace, CATALOG)
    assert np.array_equal(whole.helper, sliced.helper)
    assert np.array_equal(whole.range_row, sliced.range_row)
    assert np.array_equal(whole.matched_by, sliced.matched_by)
