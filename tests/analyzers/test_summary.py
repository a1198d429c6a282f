"""Something to say about any job (issue 25): the summary of real traces without TE.

The open-world Kineto trace of a plain 4-layer SDPA model (``tests/data/openworld``, AdamW, no
annotations of its own, ``with_stack``) and the real CPU gloo bundle. Expected counts are read
from the JSON here.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from analyzers.pipeline import analyze
from analyzers.report import KernelFamily, TraceSummary

DATA = Path(__file__).resolve().parents[1] / "data"
SDPA = DATA / "openworld" / "kineto_sdpa_single_gpu.json.gz"


@pytest.fixture(scope="module")
def events() -> list[dict[str, Any]]:
    doc = json.loads(gzip.decompress(SDPA.read_bytes()), parse_float=Decimal)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def summary() -> TraceSummary:
    found = analyze(SDPA).summary
    assert found is not None
    return found


def _ns(us: Decimal) -> int:
    return int(us * 1000)


def test_top_kernels_by_family(summary: TraceSummary, events: list[dict[str, Any]]) -> None:
    kernels = [e for e in events if e.get("cat") == "kernel"]
    gemm = [e for e in kernels if e["name"].startswith("nvjet_") or "gemm" in e["name"]]
    (row,) = [r for r in summary.families if r.library == "gemm"]
    assert row.family is KernelFamily.GEMM and row.activities == len(gemm)
    assert row.gpu_time_ns == sum(_ns(e["dur"]) for e in gemm)
    assert summary.families[0].library == "gemm"  # the largest family first
    attention = {r.library for r in summary.families if r.family is KernelFamily.ATTENTION}
    assert {"flash_attn_fwd", "flash_attn_bwd", "cudnn_sdpa_bwd"} <= attention
    assert KernelFamily.OPTIMIZER in {r.family for r in summary.families}
    assert summary.communication_share == 0.0


def test_top_cpu_ops_by_self_time(summary: TraceSummary, events: list[dict[str, Any]]) -> None:
    mm = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    (row,) = [r for r in summary.cpu_ops if r.name == "aten::mm"]
    assert row.calls == len(mm) and row.inclusive_ns == sum(_ns(e["dur"]) for e in mm)
    assert 0 < row.self_ns <= row.inclusive_ns
    assert [r.self_ns for r in summary.cpu_ops] == sorted(
        (r.self_ns for r in summary.cpu_ops), reverse=True
    )


def test_uncatalogued_ranges_and_the_sync_line(
    summary: TraceSummary, events: list[dict[str, Any]]
) -> None:
    (adam,) = [r for r in summary.ranges if r.name == "Optimizer.step#AdamW.step"]
    assert adam.calls == 3  # one per profiled step
    items = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::item"]
    (pointer,) = [p for p in summary.sync_pointers if p.op == "aten::item"]
    # AdamW's .item() calls, pointed at the user's frame that calls opt.step(); they read CPU
    # step counters (no blocking CUDA call): nothing to do (tests/analyzers/test_sync_saving.py)
    assert pointer.frame == "sdpa_model.py:40 in step"
    assert pointer.calls == len(items) and pointer.blocking_calls == 0
    assert summary.do_first == []


def test_cpu_gloo_run_has_communication_share_and_do_first() -> None:
    report = analyze(DATA / "cpu-gloo" / "cpu_smoke.tar.gz")
    assert report.summary is not None
    share = report.summary.communication_share
    assert share is not None and 0 < share < 1  # gloo send/recv on the CPU
    assert any(r.name == "gloo:send" for r in report.summary.ranges)
    rules = [a.rule for a in report.summary.do_first]
    assert 0 < len(rules) <= 3 and "padded-path-without-padding" in rules


def test_cli_prints_do_this_first_before_the_tables_and_the_summary() -> None:
    from typer.testing import CliRunner

    from cptrace.cli import app

    nccl = DATA / "openworld" / "kineto_nccl_world1.json.gz"  # a torch.cuda.synchronize() per step
    result = CliRunner().invoke(app, ["analyze", str(nccl)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.index("Do this first") < out.index("helpers, per step")
    assert "nccl_world1.py:33 in main" in out
    assert "GPU time by kernel family (totals, all ranks)" in out
    assert "top CPU ops by self time" in out
