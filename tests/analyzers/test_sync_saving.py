"""A host-sync action carries its estimated saving, recomputed here from the plain JSON (issue 25).

Real traces (``tests/data/openworld``):

* ``kineto_nccl_world1``: ``torch.cuda.synchronize()`` inside every profiled step
  (``cudaDeviceSynchronize`` in the user's ``main``). The estimate: per step, the GPU idle time
  from each blocking call inside a step until the first GPU activity that starts after it
  returned (the queue it drained stays empty until the host launches again), summed over the
  steps and divided by their number.
* ``kineto_sdpa_single_gpu``: AdamW's 288 ``.item()`` calls read CPU step counters: no CUDA call
  inside any of them, so they waited for nothing and are no action; the one
  ``torch.cuda.synchronize()`` after the loop is between steps, no action either.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from analyzers.findings.summary import LINE_CAVEAT, SAVING_METHOD, do_first
from analyzers.pipeline import analyze
from analyzers.report import SyncPointer

DATA = Path(__file__).resolve().parents[1] / "data" / "openworld"
NCCL = DATA / "kineto_nccl_world1.json.gz"
SDPA = DATA / "kineto_sdpa_single_gpu.json.gz"
ACTIVITIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def _events(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _span(e: dict[str, Any]) -> tuple[int, int]:
    start = int(Decimal(e["ts"]) * 1000)
    return start, start + int(Decimal(e["dur"]) * 1000)


def _idle(busy: list[tuple[int, int]], lo: int, hi: int) -> int:
    covered, reach = 0, lo
    for s, e in sorted(busy):
        s, e = max(s, reach), min(e, hi)
        if e > s:
            covered += e - s
            reach = e
    return (hi - lo) - covered


def test_host_sync_in_the_steps_carries_its_estimated_saving() -> None:
    events = _events(NCCL)
    busy = [_span(e) for e in events if e.get("cat") in ACTIVITIES]
    cpu = [e for e in events if e.get("cat") in ("user_annotation", "cuda_runtime")]
    steps = [_span(e) for e in cpu if e["name"].startswith("ProfilerStep#")]
    syncs = [_span(e) for e in cpu if e["name"] == "cudaDeviceSynchronize"]
    inside = [(a, b) for a, b in syncs if any(lo <= a < hi for lo, hi in steps)]
    assert len(steps) == 3 and len(inside) == 3 and len(syncs) == 4
    idle = 0
    for a, b in inside:
        refill = min([s for s, _ in busy if s >= b], default=b)  # the last: no work after
        idle += _idle(busy, a, refill)
    expected = round(idle / len(steps) / 1e6, 4)
    assert expected == 0.2257  # the figure docs/analyzers.md states

    summary = analyze(NCCL).summary
    assert summary is not None
    (pointer,) = summary.sync_pointers
    assert (pointer.op, pointer.calls, pointer.step_calls, pointer.blocking_calls) == (
        "cudaDeviceSynchronize", 4, 3, 4,
    )  # fmt: skip
    assert pointer.saving_ms == expected
    assert pointer.text == (
        f"nccl_world1.py:33 in main: cudaDeviceSynchronize x4, 4 blocking, "
        f"{(pointer.gpu_idle_ns or 0) / 1e6:.3f} ms GPU idle after"
    )
    (action,) = summary.do_first
    assert action.saving_ms == expected and action.saving_basis == "estimate"
    assert pointer.frame in action.action and action.rule == "host-sync-in-step"
    assert SAVING_METHOD in action.evidence and LINE_CAVEAT in action.evidence
    assert f"saves ~{expected:.2f} ms per iteration (estimate)" == action.saving_text


def test_syncs_that_waited_for_nothing_or_sat_between_steps_are_no_action() -> None:
    events = _events(SDPA)
    runtime = [(_span(e), e["tid"]) for e in events if e.get("cat") == "cuda_runtime"]
    scalar = [e for e in events if e.get("cat") == "cpu_op"
              and e["name"] == "aten::_local_scalar_dense"]  # fmt: skip
    for op in scalar:  # no CUDA call at all inside an .item(): CPU tensors
        lo, hi = _span(op)
        assert not [1 for (a, _), tid in runtime if tid == op["tid"] and lo <= a <= hi]
    summary = analyze(SDPA).summary
    assert summary is not None
    by_op = {p.op: p for p in summary.sync_pointers}
    item = by_op["aten::item"]
    assert item.calls == item.step_calls == len(scalar) == 288
    assert (item.blocking_calls, item.gpu_idle_ns, item.saving_ms) == (0, 0, 0.0)
    final = by_op["cudaDeviceSynchronize"]
    assert (final.calls, final.step_calls, final.blocking_calls) == (1, 0, 1)
    assert final.saving_ms is None  # between steps: no per-step saving, harmless
    assert summary.do_first == []
    assert item.text.endswith("(no blocking CUDA call inside: they waited for nothing)")


def test_kineto_frames_hold_no_call_line() -> None:
    """What the trace gives for the line of a sync: a ``python_function`` event names its own
    frame (``file(line): function``) and links to its parent by id; no field holds the line
    the parent was running at the call, so the pointer names the function, with the caveat."""
    frames = [e for e in _events(NCCL) if e.get("cat") == "python_function"]
    keys = {k for e in frames for k in e.get("args", {})}
    assert keys <= {"Python id", "Python parent id", "Python module id", "Ev Idx"}


@pytest.mark.parametrize("path", [NCCL], ids=["nccl_world1"])
def test_cli_prints_the_saving_in_do_this_first(path: Path) -> None:
    from typer.testing import CliRunner

    from cptrace.cli import app

    result = CliRunner().invoke(app, ["analyze", str(path), "--report", "summary"])
    assert result.exit_code == 0, result.output
    out = result.output
    head = out[: out.index("GPU time by kernel family")]
    assert "Do this first" in head and "nccl_world1.py:33 in main" in head
    assert "ms per iteration (estimate)" in head


def test_without_gpu_a_sync_in_the_steps_is_an_action_without_saving() -> None:
    """A CPU run (``cptrace profile`` of ``tests/runners/scripts/plain_torch.py`` on CPU names
    ``plain_torch.py:15 in <module>: aten::item x3``): the wait is not observed, so the action
    has no saving and says why; a sync between steps is no action."""
    in_steps = SyncPointer(frame="plain_torch.py:15 in <module>", op="aten::item", calls=3,
                           step_calls=3)  # fmt: skip
    between = SyncPointer(frame="plain_torch.py:20 in <module>", op="aten::item", calls=1)
    (action,) = do_first([], [in_steps, between], gpu=False)
    assert in_steps.frame in action.action and action.saving_ms is None
    assert "this run had no GPU activity" in action.evidence and LINE_CAVEAT in action.evidence
