"""Kernel names of nsys (EDG demangling) and Kineto (GNU demangling) meet at one key.

The real pair of the reference workload (tests/data/te-2.20.2-h200x2: one nsys export, two
Kineto files of the same TE 2.20.2 run) names every templated kernel differently; compared
arm by arm, no kernel may disappear and reappear only because of its spelling.
"""

from __future__ import annotations

import pytest

from analyzers.compare import compare_reports
from analyzers.kernel_names import kernel_key
from analyzers.pipeline import Analysis

ARMS = ("auto_clone", "explicit_false", "auto_same")

# (nsys spelling, Kineto spelling) of the same kernel, copied from the real traces.
SAME_KERNEL = [
    (
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<int>,"
        " std::array<char *, (unsigned long)3>>(int, T2, T3)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<int>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<int>, std::array<char*, 3ul>)",
    ),
    (
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)",
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    ),
    (
        "transformer_engine::fused_attn::cu_seqlens_to_actual_seqlens(long, long, const int *, "
        "const int *, int *, int *)",
        "transformer_engine::fused_attn::cu_seqlens_to_actual_seqlens(long, long, int const*, "
        "int const*, int*, int*)",
    ),
    (
        "void transformer_engine::context_parallel::thd_lse_kernel<(bool)1, "
        "transformer_engine::context_parallel::ReadLseFunctor>(float *, float *, int *, int, int,"
        " int, int)",
        "void transformer_engine::context_parallel::thd_lse_kernel<true, "
        "transformer_engine::context_parallel::ReadLseFunctor>(float*, float*, int*, int, int, "
        "int, int)",
    ),
    (
        "void at::native::<unnamed>::searchsorted_cuda_kernel<long, long>(T2 *, const T1 *, "
        "const T1 *, const long *, long, long, long, bool, bool)",
        "void at::native::(anonymous namespace)::searchsorted_cuda_kernel<long, long>(long*, "
        "long const*, long const*, long const*, long, long, long, bool, bool)",
    ),
    (
        "void at::native::index_elementwise_kernel<(int)128, (int)4, void "
        "at::native::gpu_index_kernel<void at::native::index_kernel_impl<at::native::OpaqueType<"
        "(int)4>>(at::TensorIteratorBase &, c10::ArrayRef<long>, c10::ArrayRef<long>)::[lambda("
        "char *, const char *, long) (instance 1)]>(at::TensorIteratorBase &, c10::ArrayRef<long>"
        ", c10::ArrayRef<long>, const T1 &, bool)::[lambda(int) (instance 1)]>(long, T3)",
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
        "at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, "
        "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>("
        "at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, "
        "at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, "
        "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} const&, "
        "bool)::{lambda(int)#1}>(long, at::native::gpu_index_kernel<...>)",
    ),
]


@pytest.mark.parametrize(("nsys", "kineto"), SAME_KERNEL)
def test_both_spellings_of_one_kernel_share_a_key(nsys: str, kineto: str) -> None:
    assert kernel_key(nsys) == kernel_key(kineto)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("void k<(int)4, float>(T1)", "void k<8, float>(int)"),
        ("void k<(bool)1>(T1)", "void k<false>(int)"),
        ("void ns::<unnamed>::k<float>(T1)", "void ns::k<float>(float)"),
        ("f::{lambda()#1}", "f::{lambda()#2}"),
        ("triton_per_fused_add_0", "triton_per_fused_add_1"),
    ],
)
def test_different_kernels_keep_different_keys(one: str, other: str) -> None:
    assert kernel_key(one) != kernel_key(other)


def test_no_two_kernels_of_one_real_trace_share_a_key(
    nsys_3arms: Analysis, kineto_3arms: Analysis
) -> None:
    for analysis in (nsys_3arms, kineto_3arms):
        names = {k.name for k in analysis.report.kernels}
        assert len({kernel_key(n) for n in names}) == len(names) > 30


@pytest.mark.parametrize("arm", ARMS)
def test_nsys_vs_kineto_of_one_workload_no_kernel_moves_by_name(
    nsys_3arms: Analysis, kineto_3arms: Analysis, arm: str
) -> None:
    base, head = nsys_3arms.report, kineto_3arms.report
    report = compare_reports(base, head, base_window=f"nsys_arm:{arm}", head_window=f"arm:{arm}")
    moved = [(d.status, d.name) for d in report.kernel_deltas if d.status != "changed"]
    assert [m for m in moved if m[0] != "unchanged"] == []
    assert len(report.kernel_deltas) >= 34
    # the display name is the base's (nsys) spelling, not the key
    spelled = {k.name for k in base.kernels if k.window == f"nsys_arm:{arm}"}
    assert {d.name for d in report.kernel_deltas} <= spelled
    # same launches per step on both sides: the kernel counts per step agree exactly
    assert all(d.delta_count == 0 for d in report.kernel_deltas), [
        (d.name[:60], d.delta_count) for d in report.kernel_deltas if d.delta_count
    ]


def test_whole_traces_differ_only_by_the_kernels_kineto_did_not_capture(
    nsys_3arms: Analysis, kineto_3arms: Analysis
) -> None:
    # nsys covers the whole run (start-up included), Kineto only the profiled steps: kernels
    # may disappear (start-up only), none may appear, and none that disappears ran in an arm.
    report = compare_reports(nsys_3arms.report, kineto_3arms.report)
    assert [d.name for d in report.kernel_deltas if d.status == "appeared"] == []
    gone = {kernel_key(d.name) for d in report.kernel_deltas if d.status == "disappeared"}
    in_arms = {
        kernel_key(k.name) for k in nsys_3arms.report.kernels if k.window.startswith("nsys_arm:")
    }
    assert gone and not gone & in_arms
