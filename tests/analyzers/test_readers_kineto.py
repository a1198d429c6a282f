"""Kineto reader on the real traces: counts, ranks, Python frames, nesting, streaming."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from testkit import DATA_DIR

from analyzers.errors import CorruptTraceError, HostileTraceError
from analyzers.model import ACTIVITY_DTYPE, LAUNCH_DTYPE, ActivityKind, RangeKind, Trace
from analyzers.readers import (
    _files,
    _json_stream,
    _kineto_layout,
    kineto,
    read_kineto,
    read_trace,
    read_traces,
)
from analyzers.readers._labels import python_frame_label
from analyzers.readers.kineto import read_kineto_files

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

DATA = DATA_DIR
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
    assert trace.metadata["skipped_events"] == {}
    assert len(trace.gpu_ranges) == 126  # gpu_user_annotation rows, kept for the timeline


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
        row = by_start[(round(frame["ts"] * 1000), python_frame_label(frame["name"]))]
        up = int(trace.ranges["parent"][row])
        assert up >= 0
        assert trace.ranges["kind"][up] == RangeKind.PYTHON
        assert trace.strings[int(trace.ranges["name"][up])] == python_frame_label(parent["name"])
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
    monkeypatch.setattr(kineto, "STRUCTS_PATH", False)
    monkeypatch.setattr(kineto, "LAYOUT_FAST_PATH", False)
    monkeypatch.setattr(kineto, "CHUNKS_PATH", False)
    monkeypatch.setattr(_json_stream, "CHUNK_CHARS", 7)
    chunked = read_kineto(SYNTH[1])
    _assert_same(chunked, reference)


def test_content_sniffing_ignores_the_extension(tmp_path: Path) -> None:
    odd = tmp_path / "rank1.bin"
    odd.write_bytes(SYNTH[1].read_bytes())
    assert read_trace(odd).format == "kineto"
    plain = tmp_path / "rank1.trace"
    with gzip.open(SYNTH[1], "rb") as fh:
        plain.write_bytes(fh.read())
    assert read_trace(plain).rank_list() == [1]


def _scanner(path: Path, monkeypatch: pytest.MonkeyPatch) -> Trace:
    with monkeypatch.context() as patch:
        patch.setattr(kineto, "STRUCTS_PATH", False)
        patch.setattr(kineto, "LAYOUT_FAST_PATH", False)
        patch.setattr(kineto, "CHUNKS_PATH", False)
        trace = read_kineto(path)
    assert trace.metadata["json_parser"] == "json-scanner"
    return trace


def _assert_same(fast: Trace, slow: Trace) -> None:
    """Row for row, id for id: the two parsers must be interchangeable."""
    for table in ("activities", "launches", "ranges"):
        assert np.array_equal(getattr(fast, table), getattr(slow, table)), table
    assert fast.strings.names == slow.strings.names
    assert fast.thread_names == slow.thread_names
    assert (fast.span, fast.ranks, fast.notes) == (slow.span, slow.ranks, slow.notes)
    facts = {k: v for k, v in fast.metadata.items() if k != "json_parser"}
    assert facts == {k: v for k, v in slow.metadata.items() if k != "json_parser"}


def test_struct_and_layout_paths_equal_the_scanner_on_real_traces(
    arms: list[Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    for path, fast in zip(ARMS, arms, strict=True):
        assert fast.metadata["json_parser"] == "msgspec-structs"
        _assert_same(fast, _scanner(path, monkeypatch))
        with monkeypatch.context() as patch:
            patch.setattr(kineto, "STRUCTS_PATH", False)
            layout = read_kineto(path)
        assert layout.metadata["json_parser"] == "kineto-layout"
        _assert_same(layout, fast)


def test_layout_chunk_boundaries_do_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = read_kineto(SYNTH[0])
    monkeypatch.setattr(kineto, "STRUCTS_PATH", False)
    monkeypatch.setattr(_kineto_layout, "CHUNK_BYTES", 900)  # a few events per chunk
    monkeypatch.setattr(_files, "READ_BYTES", 97)
    chunked = read_kineto(SYNTH[0])
    assert chunked.metadata["json_parser"] == "kineto-layout"
    _assert_same(chunked, reference)


def test_other_json_layouts_take_the_chunked_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gzip.open(SYNTH[0], "rt") as fh:
        document = json.load(fh)
    compact = tmp_path / "kineto_rank0.json"
    compact.write_text(json.dumps(document, separators=(",", ":")))
    monkeypatch.setattr(kineto, "STRUCTS_PATH", False)
    trace = read_kineto(compact)
    assert trace.metadata["json_parser"] == "json-chunks"
    _assert_same(trace, read_kineto(SYNTH[0]))


def _edit_layout(text: bytes, cat: bytes, old: bytes, new: bytes, nth: int = 0) -> bytes:
    """Replace ``old`` by ``new`` inside the ``nth`` event of category ``cat``."""
    at = -1
    for _ in range(nth + 1):
        at = text.index(b'"cat": "' + cat + b'"', at + 1)
    end = text.index(b"\n  }", at)
    event = text[at:end]
    assert old in event, (old, event)
    return text[:at] + event.replace(old, new, 1) + text[end:]


def test_events_off_the_layout_take_the_json_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Escapes, exponents, string ids: still Kineto's layout, decoded exactly like JSON."""
    with gzip.open(SYNTH[1], "rb") as fh:
        text = fh.read()
    with gzip.open(SYNTH[1], "rt") as fh:
        events = json.load(fh)["traceEvents"]
    frames = [e for e in events if e.get("cat") == "python_function"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    name = json.dumps(frames[0]["name"]).encode()
    text = _edit_layout(text, b"python_function", name, b'"say \\"hi\\" \\\\ \\u00e9"')
    dur = f'"dur": {ops[1]["dur"]:.3f}'.encode()
    text = _edit_layout(text, b"cpu_op", dur, b'"dur": 1.25e1', nth=1)
    tid = f'"tid": {ops[2]["tid"]},'.encode()
    text = _edit_layout(text, b"cpu_op", tid, f'"tid": "{ops[2]["tid"]}",'.encode(), nth=2)
    # a name with an escaped quote that looks like the end of the line's keys
    tricky = b'"x\\", \\"pid\\": 1, \\"tid\\": 2,"'
    text = _edit_layout(text, b"python_function", json.dumps(frames[3]["name"]).encode(), tricky, 3)
    # a launch whose correlation id is not the last arg (and one with a fractional tid)
    text = _edit_layout(text, b"cuda_runtime", b'"External id"', b'"correlation": 31, "x"', 1)
    launch_tid = re.search(rb'"cat": "cuda_runtime".*?"tid": (\d+),', text)
    assert launch_tid is not None
    text = _edit_layout(text, b"cuda_runtime", b'"tid": %s,' % launch_tid[1], b'"tid": 7.0,', 2)
    edited = tmp_path / "kineto_rank1.json"
    edited.write_bytes(text)
    fast = read_kineto(edited)
    assert fast.metadata["json_parser"] == "kineto-layout"
    slow = _scanner(edited, monkeypatch)
    _assert_same(fast, slow)
    names = set(fast.strings.names)
    assert 'say "hi" \\ é' in names
    assert 'x", "pid": 1, "tid": 2,' in names
    row = np.flatnonzero(fast.ranges["start"] == round(ops[1]["ts"] * 1000))
    assert (fast.ranges["end"][row] - fast.ranges["start"][row]).tolist() == [12_500]
    assert 7 in fast.launches["thread"].tolist()


def test_events_off_the_plain_shape_take_the_json_path_in_any_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The any-layout reader cuts out only what reads plainly; the rest goes through JSON.

    Escapes (and a backslash run before a closing quote), an exponent, a string tid, a space
    before a colon, a duplicated ``args.correlation`` (JSON keeps the last), a correlation
    outside ``args`` (at the top, or in another object), a nested object in ``args``: every
    variant reads exactly like the
    standard library's scanner, in compact and indented layouts.
    """
    with gzip.open(SYNTH[1], "rt") as fh:
        document = json.load(fh)
    events = document["traceEvents"]
    frames = [e for e in events if e.get("cat") == "python_function"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    frames[0]["name"] = 'say "hi" \\ \u00e9'
    frames[1]["name"] = "ends in backslashes \\\\"
    frames[2]["name"] = 'x", "pid": 1, "tid": 2, "ts": 3,'
    ops[1]["dur"] = 98765.4321  # written as an exponent below
    ops[2]["tid"] = str(ops[2]["tid"])
    ops[3]["ts"] = 4444444444.25  # written with a space before its colon below
    runtime[1]["args"] = {"marker": 1, **runtime[1]["args"]}  # a first, overridden "correlation"
    runtime[2]["correlation"] = runtime[2]["args"].pop("correlation")
    runtime[3]["args"]["nested"] = {"correlation": 1}
    runtime[4]["args"].pop("correlation")
    runtime[4]["other"] = {"correlation": 777777}  # one level down, but not in args
    for name, options in (("compact", {"separators": (",", ":")}), ("indent", {"indent": 3})):
        text = json.dumps(document, **options)  # type: ignore[arg-type]
        colon = ":" if name == "compact" else ": "
        for old, new in (
            ("98765.4321", "9.87654321e4"),
            (f'"ts"{colon}4444444444.25', f'"ts" {colon}4444444444.25'),
            (f'"marker"{colon}1', f'"correlation"{colon}987654'),
        ):
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        edited = tmp_path / f"{name}_rank1.json"
        edited.write_text(text)
        chunked = read_kineto(edited)
        assert chunked.metadata["json_parser"] == "json-chunks"
        _assert_same(chunked, _scanner(edited, monkeypatch))
        names = set(chunked.strings.names)
        assert {'say "hi" \\ é', "ends in backslashes \\\\"} <= names
        row = np.flatnonzero(chunked.ranges["start"] == round(ops[1]["ts"] * 1000))
        assert (chunked.ranges["end"][row] - chunked.ranges["start"][row]).tolist() == [98_765_432]
        corr = chunked.launches["correlation"].tolist()
        assert runtime[1]["args"]["correlation"] in corr  # the last of the two keys
        assert 987654 not in corr
        assert runtime[2]["correlation"] not in corr  # not an args.correlation: no launch row
        assert runtime[3]["args"]["correlation"] in corr
        assert 777777 not in corr


def test_truncated_layout_text_reports_the_json_position(tmp_path: Path) -> None:
    with gzip.open(SYNTH[0], "rb") as fh:
        text = fh.read()
    cut = tmp_path / "kineto_rank0.json"
    cut.write_bytes(text[: len(text) // 2])
    with pytest.raises(CorruptTraceError, match="malformed JSON at character"):
        read_kineto(cut)


def test_decompression_cap_applies_to_kineto() -> None:
    with pytest.raises(HostileTraceError, match="the cap"):
        read_kineto(SYNTH[0], max_decompressed_bytes=100_000)


def test_concatenated_gzip_members_read_whole(tmp_path: Path) -> None:
    with gzip.open(SYNTH[0], "rb") as fh:
        text = fh.read()
    split = tmp_path / "kineto_rank0.json.gz"
    split.write_bytes(gzip.compress(text[:5000]) + gzip.compress(text[5000:]))
    _assert_same(read_kineto(split), read_kineto(SYNTH[0]))


def test_parallel_reads_equal_one_by_one(
    arms: list[Trace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(kineto.WORKERS_ENV, "2")
    if kineto._workers(2) < 2:
        pytest.skip("this process cannot fork readers (threads running or no fork)")
    for parallel, alone in zip(read_kineto_files(ARMS), arms, strict=True):
        _assert_same(parallel, alone)
        # the model's own dtype objects, so numpy's fast ufunc.at loops apply to its columns
        for table, dtype in (
            (parallel.activities, ACTIVITY_DTYPE),
            (parallel.launches, LAUNCH_DTYPE),
        ):
            assert table.dtype is dtype
            assert (table["end"] - table["start"]).dtype is np.dtype(np.int64)
    bad = tmp_path / "kineto_rank1.json"
    with gzip.open(SYNTH[1], "rb") as fh:
        bad.write_bytes(fh.read()[:4000])
    with pytest.raises(CorruptTraceError, match=str(bad)):
        read_kineto_files([SYNTH[0], bad])
