"""Kineto reader on the real traces: counts, ranks, Python frames, nesting, streaming."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from analyzers.model import ActivityKind, RangeKind, Trace
from analyzers.readers import _json_stream, read_kineto, read_trace, read_traces

DATA = Path(__file__).resolve().parents[1] / "data"
ARMS = [DATA / "te-2.20.2-h200x2" / f"kineto_3arms_rank{r}.json.gz" for r in (0, 1)]
SYNTH = [DATA / "synthetic-h200x2" / f"kineto_rank{r}.json.gz" for r in (0, 1)]
HELPER_FRAME = "context_parallel.py(214): get_cu_seqlens_on_cp_rank"


@pytest.fixture(scope="module")
def arms() -> list[Trace]:
    return [read_kineto(p) for p in ARMS]


def _ancestors(trace: Trace, row: int) -> list[str]:
    names = []
    parent = int(trace.ranges["parent"][row])
    while parent >= 0:
        names.append(trace.strings[int(trace.ranges["name"][parent])])
        parent = int(trace.ranges["parent"][parent])
    return names


@pytest.mark.parametrize(
    ("rank", "kernels", "memcpy", "memset"), [(0, 2_943, 249, 216), (1, 2_871, 213, 216)]
)
def test_three_arm_counts(
    arms: list[Trace], rank: int, kernels: int, memcpy: int, memset: int
) -> None:
    trace = arms[rank]
    assert trace.rank_list() == [rank]
    kinds = Counter(trace.activities["kind"].tolist())
    assert kinds == {
        ActivityKind.KERNEL: kernels,
        ActivityKind.MEMCPY: memcpy,
        ActivityKind.MEMSET: memset,
    }
    assert trace.metadata["distributedInfo"]["rank"] == rank  # type: ignore[index]
    assert trace.metadata["with_stack"] == 1
    assert trace.metadata["device_names"] == ["NVIDIA H200", "NVIDIA H200"]
    assert trace.metadata["skipped_events"] == {
        "gpu_user_annotation (GPU-side, not a CPU range)": 126
    }


def test_every_activity_joins_a_launch_of_its_cpu_process(arms: list[Trace]) -> None:
    for trace in arms:
        launches = dict(
            zip(
                trace.launches["correlation"].tolist(),
                trace.launches["process"].tolist(),
                strict=True,
            )
        )
        acts = trace.activities
        assert all(
            launches[c] == p
            for c, p in zip(acts["correlation"].tolist(), acts["process"].tolist(), strict=True)
        )
        assert set(trace.ranks) >= set(np.unique(acts["process"]).tolist())


def test_helper_python_frames_only_inside_auto_clone(arms: list[Trace]) -> None:
    for trace in arms:
        ids = [i for i, n in enumerate(trace.strings.names) if n.endswith(HELPER_FRAME)]
        rows = np.flatnonzero(np.isin(trace.ranges["name"], ids))
        assert len(rows) == 48
        assert (trace.ranges["kind"][rows] == RangeKind.PYTHON).all()
        arm_rows = [
            i
            for i in range(len(trace.ranges))
            if trace.strings[int(trace.ranges["name"][i])].startswith("arm:")
        ]
        for row in rows:
            r = trace.ranges[row]
            around = [
                trace.strings[int(trace.ranges["name"][a])]
                for a in arm_rows
                if trace.ranges["thread"][a] == r["thread"]
                and trace.ranges["start"][a] <= r["start"] <= trace.ranges["end"][a]
            ]
            assert around == ["arm:auto_clone"]
            # its own ancestry is Python frames only: frames and annotations nest separately
            assert all(not name.startswith("arm:") for name in _ancestors(trace, int(row)))


def test_range_kinds(arms: list[Trace]) -> None:
    kinds = Counter(arms[0].ranges["kind"].tolist())
    assert kinds == {
        RangeKind.PYTHON: 64_557,
        RangeKind.CPU_OP: 11_307,
        RangeKind.RECORD_FUNCTION: 117,
    }


def test_python_parent_ids_agree_with_time_nesting() -> None:
    """Kineto's "Python parent id" tree and the time-based nesting must be the same tree."""
    with gzip.open(SYNTH[0], "rt") as fh:
        events = json.load(fh)["traceEvents"]
    frames = {e["args"]["Python id"]: e for e in events if e.get("cat") == "python_function"}
    trace = read_kineto(SYNTH[0])
    python = trace.ranges["kind"] == RangeKind.PYTHON
    by_start = {
        (int(trace.ranges["start"][i]), trace.strings[int(trace.ranges["name"][i])]): i
        for i in np.flatnonzero(python)
    }
    checked = 0
    for frame in frames.values():
        parent = frames.get(frame["args"]["Python parent id"])
        if parent is None:
            continue
        row = by_start[(round(frame["ts"] * 1000), frame["name"])]
        up = int(trace.ranges["parent"][row])
        assert up >= 0
        assert trace.ranges["kind"][up] == RangeKind.PYTHON
        assert trace.strings[int(trace.ranges["name"][up])] == parent["name"]
        assert int(trace.ranges["start"][up]) == round(parent["ts"] * 1000)
        checked += 1
    assert checked > 500


def test_synthetic_pair_merges_to_two_ranks() -> None:
    trace = read_traces(SYNTH)
    assert trace.rank_list() == [0, 1]
    assert trace.notes == []
    kernels = trace.activities[trace.activities["kind"] == ActivityKind.KERNEL]
    assert Counter(kernels["rank"].tolist()) == {0: 55, 1: 55}
    helper = trace.strings.lookup("get_cu_seqlens_on_cp_rank")
    rf = trace.ranges[(trace.ranges["name"] == helper)]
    assert len(rf) == 10 and (rf["kind"] == RangeKind.RECORD_FUNCTION).all()


def test_timestamps_are_exact_nanoseconds() -> None:
    with gzip.open(SYNTH[0], "rt") as fh:
        events = json.load(fh)["traceEvents"]
    first_kernel = next(e for e in events if e.get("cat") == "kernel")
    trace = read_kineto(SYNTH[0])
    row = trace.activities[trace.activities["correlation"] == first_kernel["args"]["correlation"]]
    ts_text = repr(first_kernel["ts"])  # e.g. 5145914215948.547 -> ...948547 ns
    whole, _, frac = ts_text.partition(".")
    assert int(row["start"][0]) == int(whole) * 1000 + int((frac + "000")[:3])


def test_tiny_chunks_give_the_same_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk boundaries inside keys, numbers and strings must not change the result."""
    reference = read_kineto(SYNTH[1])
    monkeypatch.setattr(_json_stream, "CHUNK_CHARS", 7)
    chunked = read_kineto(SYNTH[1])
    assert np.array_equal(reference.activities, chunked.activities)
    assert np.array_equal(reference.ranges, chunked.ranges)
    assert chunked.metadata == reference.metadata


def test_content_sniffing_ignores_the_extension(tmp_path: Path) -> None:
    odd = tmp_path / "rank1.bin"
    odd.write_bytes(SYNTH[1].read_bytes())
    assert read_trace(odd).format == "kineto"
    plain = tmp_path / "rank1.trace"
    with gzip.open(SYNTH[1], "rb") as fh:
        plain.write_bytes(fh.read())
    assert read_trace(plain).rank_list() == [1]
