"""Honest labels: TE and CP helpers only with TE/CP evidence; kernel names map to their library.

The traces here are small Kineto files written by hand as plain JSON (the shapes of a
flash-attn or torch SDPA model, a pipeline-parallel send/recv, an FSDP all-gather), analysed
through the real CLI. The same kernels inside TE's CP forward must still be TE/CP helpers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from testkit import DATA_DIR
from typer.testing import CliRunner

from cptrace.cli import app

RUNNER = CliRunner()
PID, TID, DEVICE, STREAM = 100, 100, 0, 7
TE_CP_FORWARD = (
    "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py(1587): forward"
)
TE_P2P = (
    "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py(112): "
    "flash_attn_p2p_communicate"
)
KERNELS = {
    "flash2": "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>"
    "(Flash_fwd_params)",
    "flash2_plain": "flash_fwd_kernel",
    "torch_flash": "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits"
    "<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, true>(pytorch_flash::"
    "Flash_fwd_params)",
    "cudnn": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_"
    "4x1x1_cga1x1x1_kernel0_0",
    "gemm": "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
    "cublas": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
    "send_recv": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    "all_gather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
    "broadcast": "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
}
LIBRARY = {
    "flash2": "flash_attn_fwd",
    "flash2_plain": "flash_attn_fwd",
    "torch_flash": "flash_attn_fwd",
    "cudnn": "cudnn_sdpa_fwd",
    "gemm": "gemm",
    "cublas": "gemm",
    "send_recv": "nccl_send_recv",
    "all_gather": "nccl_all_gather",
    "all_reduce": "nccl_all_reduce",
    "reduce_scatter": "nccl_reduce_scatter",
    "broadcast": "nccl_broadcast",
}
ENCLOSING = {  # the record_function / op torch writes around each launch
    "torch_flash": "aten::_flash_attention_forward",
    "cudnn": "aten::_scaled_dot_product_cudnn_attention",
    "send_recv": "nccl:send 0->1",
    "all_gather": "nccl:_all_gather_base",
    "all_reduce": "nccl:all_reduce",
}
TE_OR_CP = ("te_", "cp_", "get_cu_seqlens", "get_batch_on_this_cp_rank")


def _x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def _trace(inside: str | None, steps: int = 3, kernels: dict[str, str] = KERNELS) -> dict[str, Any]:
    """A one-GPU Kineto trace: ``steps`` ProfilerSteps, each launching every kernel once, all
    of them inside a Python frame ``inside`` (or none)."""
    events: list[dict[str, Any]] = []
    correlation = 1
    t = 1000.0
    for step in range(steps):
        start = t
        if inside:
            events.append(_x("python_function", inside, t, 50.0 * len(kernels)))
        for key, kernel in kernels.items():
            if key in ENCLOSING:
                cat = "user_annotation" if ENCLOSING[key].startswith("nccl") else "cpu_op"
                events.append(_x(cat, ENCLOSING[key], t + 1, 10))
            events.append(_x("cuda_runtime", "cudaLaunchKernel", t + 2, 5, correlation=correlation))
            kernel_event = _x(
                "kernel", kernel, t + 20, 8, device=DEVICE, stream=STREAM, correlation=correlation
            )
            kernel_event["pid"], kernel_event["tid"] = DEVICE, STREAM
            events.append(kernel_event)
            correlation += 1
            t += 50
        events.append(_x("user_annotation", f"ProfilerStep#{step}", start - 1, t - start + 2))
        t += 100
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }


def _analyse(tmp_path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    result = RUNNER.invoke(app, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


def _labels(report: dict[str, Any]) -> dict[str, str]:
    """helper -> matched_by over the whole-trace rows."""
    return {h["helper"]: h["matched_by"] for h in report["helpers"] if h["window"] == "whole trace"}


def test_kernels_without_te_map_to_their_library_by_kernel_name(tmp_path: Path) -> None:
    labels = _labels(_analyse(tmp_path, _trace(inside="model.py(12): forward")))
    assert labels == {helper: "kernel-name" for helper in LIBRARY.values()}
    assert not [h for h in labels if h.startswith(TE_OR_CP)]


def test_no_te_or_cp_finding_fires_without_te(tmp_path: Path) -> None:
    report = _analyse(tmp_path, _trace(inside=None))
    for finding in report["findings"]:
        assert not (finding["helper"] or "").startswith(TE_OR_CP), finding
        assert finding["rule"] not in (
            "padded-path-without-padding",
            "padded-path-needed",
            "fast-path-with-padding",
            "zero-fill-without-padding",
        ), finding


def test_the_same_kernels_inside_te_cp_forward_are_te_and_cp_helpers(tmp_path: Path) -> None:
    labels = _labels(_analyse(tmp_path, _trace(inside=TE_CP_FORWARD)))
    assert labels["cp_p2p_send_recv"] == "kernel-name"  # SendRecv inside TE's CP forward
    assert labels["cp_all_gather"] == "kernel-name"
    assert labels["te_fused_attn_fwd"] == "kernel-name"  # cuDNN SDPA inside TE's CP forward
    assert "nccl_send_recv" not in labels and "cudnn_sdpa_fwd" not in labels
    # kernels TE does not own keep their library even inside TE
    assert labels["gemm"] == "kernel-name" and labels["nccl_all_reduce"] == "kernel-name"


def test_te_p2p_frame_claims_send_recv_by_python_frame(tmp_path: Path) -> None:
    labels = _labels(_analyse(tmp_path, _trace(inside=TE_P2P)))
    assert labels["cp_p2p_send_recv"] == "python"


# ---------------------------------------- real traces of other shapes (tests/data/openworld)

OPEN_WORLD = DATA_DIR / "openworld"
OPEN_WORLD_TRACES = sorted(OPEN_WORLD.glob("*.gz"))
CP_RULES = {
    "padded-path-without-padding",
    "padded-path-needed",
    "fast-path-with-padding",
    "zero-fill-without-padding",
}


def _kernel_names(path: Path) -> list[str]:
    """Every kernel name of a real trace, read in the test: a JSON walk or an SQL query."""
    import gzip
    import shutil
    import sqlite3
    import tempfile

    if path.name.endswith(".json.gz"):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        return [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "t.sqlite"
        with gzip.open(path) as src, open(db, "wb") as out:
            shutil.copyfileobj(src, out)
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                "JOIN StringIds s ON s.id = k.demangledName"
            ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize("path", OPEN_WORLD_TRACES, ids=lambda p: p.name)
def test_open_world_traces_name_no_te_or_cp_helper(path: Path) -> None:
    result = RUNNER.invoke(app, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    helpers = {h["helper"] for h in report["helpers"]}
    assert not [h for h in helpers if h.startswith(TE_OR_CP)], helpers
    for finding in report["findings"]:
        assert finding["rule"] not in CP_RULES, finding
        assert not (finding["helper"] or "").startswith(TE_OR_CP), finding
    # The library labels, counted against the kernel names read here.
    names = _kernel_names(path)
    launches = {
        h["helper"]: h["launches"] for h in report["helpers"] if h["window"] == "whole trace"
    }
    expected = {
        "flash_attn_fwd": sum("flash_fwd" in n for n in names),
        "cudnn_sdpa_fwd": sum(
            n.startswith("cudnn_generated_fort_native_sdpa") and "fprop" in n for n in names
        ),
        "nccl_send_recv": sum(n.startswith("ncclDevKernel_SendRecv") for n in names),
        "gemm": sum(n.startswith("nvjet_") or "gemm" in n for n in names),
    }
    for helper, count in expected.items():
        assert launches.get(helper, 0) == count, (helper, launches)
    assert sum(expected.values()) > 0  # every open-world trace has library kernels


def test_single_gpu_kineto_without_distributed_info_is_rank_0() -> None:
    path = OPEN_WORLD / "kineto_sdpa_single_gpu.json.gz"
    report = json.loads(RUNNER.invoke(app, ["analyze", str(path), "--json"]).output)
    assert report["ranks"] == [0]
    assert any("analysed as rank 0" in n for n in report["notes"])


# ---------------------------------------- one family, one label (issue 25, defect 2)

FAMILIES = {
    "fbgemm_embedding": [
        "void fbgemm_gpu::split_embedding_codegen_forward_unweighted_kernel<float, float, "
        "at::BFloat16, int, 4ul>(at::PackedTensorAccessor64<float, 1, at::RestrictPtrTraits>)",
        "split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1",
        "void fbgemm_gpu::bounds_check_indices_kernel<long, 1>(long*, long*)",
        "void fbgemm_gpu::_permute_2D_indices_weights_kernel<32, 32, long, float>(int, int, "
        "int, long const*, float const*, int const*, long const*, long const*, long*, float*)",
        "void fbgemm_gpu::linearize_index_kernel<long, int>(int*, long*)",
        "void fbgemm_gpu::_block_bucketize_sparse_features_cuda_kernel1<int, long>(int, long)",
    ],
    "fbgemm_quantize": [
        "void fbgemm_gpu::_float_to_FP8rowwise_cuda_kernel<float>(float const*, int, int, "
        "unsigned char*, bool)",
        "void fbgemm_gpu::_FP8rowwise_to_float_cuda_kernel<float>(unsigned char const*, int)",
        "void fbgemm_gpu::_float_to_fused8bitrowwise_cuda_kernel<float>(float const*, int)",
        "void fbgemm_gpu::_float_to_bfloat16_cuda_kernel(float const*, int, int, unsigned short*)",
    ],
    "cudnn_convolution": [
        "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_"
        "stage4_warpsize2x2x1_g1_tensor16x8x16_kernel_cudnn",
        "sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_"
        "warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn",
        "sm86_xmma_wgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_"
        "stage4_warpsize2x2x1_g1_tensor16x8x16_kernel_cudnn",
        "void cutlass_cudnn_train::Kernel<cutlass_cudnn_train::conv::kernel::"
        "ImplicitGemmConvolution<cutlass_cudnn_train::conv::threadblock::"
        "ImplicitGemmMultistage<float>>>(cutlass_cudnn_train::conv::kernel::Params)",
        "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, "
        "false, true>(int, int, int, float const*, int, float*, float const*)",
        "void cudnn::cnn::wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int)",
        "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(float const*)",
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, "
        "(cudnnKernelDataType_t)2>(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)",
    ],
    "cudnn_batch_norm": [
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(float, float)",
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float)",
        "void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, true, 1>(float, float)",
        "batchnorm_fwtr_nhwc_semiPersist_kernel",
    ],
    "gemm": [
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
        "volta_sgemm_128x64_nn",
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
        "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<float>>(float)",
    ],
}


def test_every_kernel_of_a_family_gets_the_family_label(tmp_path: Path) -> None:
    """fbgemm and cuDNN implicit-GEMM convolutions say "gemm" in their names and are not
    GEMMs: each family, whatever its kernels are called, gets its own one label."""
    kernels = {f"{family}{i}": n for family, names in FAMILIES.items() for i, n in enumerate(names)}
    report = _analyse(tmp_path, _trace(inside="model.py(12): forward", kernels=kernels))
    whole = [h for h in report["helpers"] if h["window"] == "whole trace"]
    launches = {h["helper"]: h["launches"] for h in whole}
    assert launches == {family: 3 * len(names) for family, names in FAMILIES.items()}
    assert {h["matched_by"] for h in whole} == {"kernel-name"}
