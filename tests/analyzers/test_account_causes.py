"""The step account on hand-made traces, one per cause, with the expected split written out.

Times are in ns; every trace is one ``ProfilerStep#1`` window per rank (a CPU range: these
traces have no GPU annotations), so the account's span is that range.
"""

from __future__ import annotations

from collections import defaultdict

from analyzers.account.build import NO_WORK, QUEUED
from analyzers.account.host import UNANNOTATED
from analyzers.model import RangeKind
from analyzers.pipeline import analyze_trace
from analyzers.report import AccountPartKind as K
from analyzers.report import AnalysisReport, StepAccount
from tests.analyzers.factories import TraceBuilder

HELPER = "get_cu_seqlens_on_cp_rank"
NCCL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _step(report: AnalysisReport, rank: int = 0) -> StepAccount:
    (step,) = [s for s in report.step_accounts if s.rank == rank and s.window == "ProfilerStep"]
    assert sum(p.time_ns for p in step.parts) == step.span_ns
    return step


def _split(step: StepAccount) -> dict[tuple[K, str], int]:
    out: dict[tuple[K, str], int] = defaultdict(int)
    for p in step.parts:
        out[(p.part, p.label)] += p.time_ns
    return dict(out)


def _idle_split(step: StepAccount) -> dict[tuple[K, str], int]:
    """The split without compute lines (their label is the kernel's helper, whichever entry of
    the catalog claims a plain ``gemm``)."""
    return {k: v for k, v in _split(step).items() if k[0] != K.COMPUTE}


def _by_part(step: StepAccount) -> dict[K, int]:
    out: dict[K, int] = defaultdict(int)
    for p in step.parts:
        out[p.part] += p.time_ns
    return dict(out)


def test_host_sleep_inside_a_named_range_is_host_bound_idle_of_that_helper() -> None:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 600, kind=RangeKind.STEP)
    b.kernel("elementwise_kernel", 10, 20, 80)  # [20, 100), launched outside any helper
    b.range(HELPER, 150, 450)  # the host sleeps in the helper, then launches its kernel
    b.kernel("triton_per_fused_cumsum", 440, 445, 55)  # [445, 500)
    step = _step(analyze_trace(b.build()).report)
    assert _split(step) == {
        (K.COMPUTE, "(unattributed)"): 80,
        (K.COMPUTE, HELPER): 55,
        (K.IDLE_HOST, HELPER): 295,  # [150, 445): from the range start to the kernel start
        (K.IDLE_HOST, UNANNOTATED): 20 + 50 + 100,  # [0, 20), [100, 150), [500, 600)
    }
    helper = next(p for p in step.parts if p.part == K.IDLE_HOST and p.label == HELPER)
    assert helper.gaps == 1 and helper.category is not None
    assert [(g.start_ns, g.duration_ns, g.offset_ns) for g in helper.largest] == [(150, 295, 150)]
    unannotated = next(p for p in step.parts if p.label == UNANNOTATED)
    assert unannotated.gaps == 3
    assert [g.duration_ns for g in unannotated.largest] == [100, 50, 20]


def test_stream_synchronize_is_synchronisation_idle_named_with_its_python_frame() -> None:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 300, kind=RangeKind.STEP)
    b.range("train.py(12): step", 15, 140, kind=RangeKind.PYTHON)
    b.kernel("gemm", 0, 10, 90)  # [10, 100)
    b.api_call("cudaStreamSynchronize", 20, 130)  # returns 30 ns after the GPU went idle
    b.kernel("gemm", 200, 205, 95)  # [205, 300)
    step = _step(analyze_trace(b.build()).report)
    assert _by_part(step)[K.COMPUTE] == 185
    assert _idle_split(step) == {
        (K.IDLE_SYNC, "cudaStreamSynchronize"): 30,  # [100, 130)
        # [130, 205): the host after the sync; Python frames do not cut, the one open at 130
        (K.IDLE_HOST, "train.py(12): step"): 75,
        (K.IDLE_HOST, UNANNOTATED): 10,  # [0, 10): before the first kernel starts
    }
    sync = next(p for p in step.parts if p.part == K.IDLE_SYNC)
    assert sync.detail == "in train.py(12): step"
    assert sync.largest[0].start_ns == 100


def test_late_peer_in_a_two_rank_collective_is_waiting_on_another_rank() -> None:
    b = TraceBuilder()
    for rank, process, thread in ((0, 100, 1), (1, 200, 2)):
        b.range("ProfilerStep#1", 0, 700, kind=RangeKind.STEP, rank=rank, process=process,
                thread=thread)
    # rank 0 reaches the exchange at 10; rank 1 computes until 590 and joins at 600
    b.kernel(NCCL, 5, 10, 690, rank=0, process=100, thread=1, stream=9)
    b.kernel("gemm", 0, 5, 585, rank=1, process=200, thread=2, stream=7)
    b.kernel(NCCL, 595, 600, 100, rank=1, process=200, thread=2, stream=9)
    report = analyze_trace(b.build()).report
    early, late = _by_part(_step(report, 0)), _by_part(_step(report, 1))
    assert early == {K.IDLE_PEER: 590, K.EXPOSED_COMMUNICATION: 100, K.IDLE_HOST: 10}
    assert late == {K.COMPUTE: 585, K.EXPOSED_COMMUNICATION: 100, K.IDLE_HOST: 5 + 10}
    wait = next(p for p in _step(report, 0).parts if p.part == K.IDLE_PEER)
    assert wait.detail == "last to arrive: rank 1"
    assert [(g.start_ns, g.duration_ns) for g in wait.largest] == [(10, 590)]


def test_exposed_nccl_with_and_without_concurrent_compute() -> None:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 600, kind=RangeKind.STEP)
    b.kernel(NCCL, 50, 100, 400, stream=9)  # [100, 500)
    b.kernel("gemm", 60, 200, 100, stream=7)  # [200, 300): hides 100 ns of it
    b.range("ProfilerStep#2", 1000, 1600, kind=RangeKind.STEP)
    b.kernel(NCCL, 1050, 1100, 400, stream=9)  # alone
    report = analyze_trace(b.build()).report
    overlapped, alone = (
        s for s in report.step_accounts if s.window == "ProfilerStep" and s.rank == 0
    )
    assert _by_part(overlapped) == {
        K.COMPUTE: 100,
        K.EXPOSED_COMMUNICATION: 300,
        K.IDLE_HOST: 100 + 100,  # before the exchange starts, and after it ends
    }
    assert _by_part(alone) == {K.EXPOSED_COMMUNICATION: 400, K.IDLE_HOST: 200}
    (group,) = [g for g in report.accounts if g.window == "ProfilerStep"]
    assert group.steps == 2 and group.span_ns == 1200
    assert sum(p.time_ns for p in group.parts) == group.span_ns
    comm = next(p for p in group.parts if p.part == K.EXPOSED_COMMUNICATION)
    assert comm.time_ns == 700 and comm.gaps == 2


def test_work_queued_before_the_gap_is_other_idle() -> None:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 200, kind=RangeKind.STEP)
    b.kernel("gemm", 0, 10, 90)  # [10, 100)
    b.kernel("gemm", 5, 150, 50)  # queued at 5, starts at 150: waited on something else
    step = _step(analyze_trace(b.build()).report)
    assert _by_part(step)[K.COMPUTE] == 140
    assert _idle_split(step) == {
        (K.IDLE_HOST, UNANNOTATED): 10,
        (K.IDLE_OTHER, QUEUED): 50,
    }


def test_memcpy_under_neither_compute_nor_nccl_is_exposed_memcpy() -> None:
    from analyzers.model import ActivityKind

    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 300, kind=RangeKind.STEP)
    b.kernel("gemm", 0, 0, 100)  # [0, 100)
    b.kernel("Memcpy DtoD (Device -> Device)", 1, 50, 150, kind=ActivityKind.MEMCPY,
             api="cudaMemcpyAsync", stream=3)  # [50, 200): 100 ns exposed
    step = _step(analyze_trace(b.build()).report)
    parts = _by_part(step)
    assert parts == {K.COMPUTE: 100, K.EXPOSED_MEMCPY: 100, K.IDLE_HOST: 100}
    copy = next(p for p in step.parts if p.part == K.EXPOSED_MEMCPY)
    assert copy.detail == "Memcpy DtoD (Device -> Device)"


def test_a_window_without_gpu_work_is_other_idle() -> None:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 500, kind=RangeKind.STEP)
    b.range(HELPER, 100, 200)  # host work only: a CPU run
    step = _step(analyze_trace(b.build()).report)
    assert _split(step) == {(K.IDLE_OTHER, NO_WORK): 500}
