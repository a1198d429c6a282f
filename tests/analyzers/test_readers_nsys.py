"""nsys reader on the real exports: counts, ranks, the correlation join, ranges and nesting."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from testkit import DATA_DIR

from analyzers.model import ActivityKind, RangeKind, Trace, launch_calls
from analyzers.readers import _nsys_sql, read_nsys
from analyzers.readers._nsys_ranges import PYTHON_NVTX_DOMAINS
from analyzers.readers._sqlite_guard import Schema, open_readonly

DATA = DATA_DIR
THREE_ARMS = DATA / "te-2.20.2-h200x2" / "nsys_3arms.sqlite.gz"
SINGLE = DATA / "synthetic-h200x2" / "nsys_single.sqlite.gz"
HELPER_SUFFIX = ".context_parallel.get_cu_seqlens_on_cp_rank"


@pytest.fixture(scope="module")
def arms() -> Trace:
    return read_nsys(THREE_ARMS)


def _gunzip(src: Path, dst: Path) -> Path:
    with gzip.open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    return dst


def _ids(trace: Trace, predicate) -> list[int]:  # type: ignore[no-untyped-def]
    return [i for i, name in enumerate(trace.strings.names) if predicate(name)]


def test_activity_counts_match_the_export(arms: Trace) -> None:
    kinds = Counter(arms.activities["kind"].tolist())
    assert kinds[ActivityKind.KERNEL] == 15_590
    assert kinds[ActivityKind.MEMCPY] == 1_860
    assert kinds[ActivityKind.MEMSET] == 1_560
    assert arms.format == "nsys"
    assert arms.notes == []


def test_nvtx_rows_become_ranges_minus_domain_records(arms: Trace) -> None:
    # 11,087 NVTX rows = 11,080 push/pop ranges + 7 NvtxDomainCreate records (not ranges).
    assert len(arms.ranges) == 11_080
    assert set(arms.metadata["nvtx_domains"]) == {"NCCL", "Python NVTX"}  # type: ignore[arg-type]


def test_two_processes_map_to_ranks_by_device(arms: Trace) -> None:
    assert sorted(arms.ranks.values()) == [0, 1]
    assert "device" in str(arms.metadata["rank_source"])
    kernels = arms.activities[arms.activities["kind"] == ActivityKind.KERNEL]
    per_rank = Counter(kernels["rank"].tolist())
    assert per_rank == {0: 7_891, 1: 7_699}
    for process, rank in arms.ranks.items():
        devices = np.unique(kernels["device"][kernels["process"] == process])
        assert devices.tolist() == [rank]
    assert (arms.launches["rank"] >= 0).all()
    assert (arms.ranges["rank"] >= 0).all()


def test_launch_process_is_the_kernel_global_pid(arms: Trace) -> None:
    assert set(np.unique(arms.launches["process"]).tolist()) == set(arms.ranks)
    # globalTid = globalPid | tid: clearing the 24 tid bits gives the pid key back
    assert ((arms.launches["thread"] & ~0xFFFFFF) == arms.launches["process"]).all()


def test_correlation_join_covers_every_activity(arms: Trace) -> None:
    launch_keys = set(
        zip(arms.launches["process"].tolist(), arms.launches["correlation"].tolist(), strict=True)
    )
    acts = arms.activities
    keys = zip(acts["process"].tolist(), acts["correlation"].tolist(), strict=True)
    assert all(key in launch_keys for key in keys)
    assert len(launch_keys) == len(arms.launches)  # no duplicate launch rows kept


def test_launch_api_names_are_normalized(arms: Trace) -> None:
    calls = launch_calls(arms.launches)
    apis = Counter(arms.strings[int(i)] for i in arms.launches["api"][calls])
    assert apis == {
        "cudaLaunchKernel": 12_346,
        "cuLaunchKernelEx": 2_892,
        "cuLaunchKernel": 352,
        "cudaMemcpyAsync": 1_860,
        "cudaMemsetAsync": 1_560,
    }
    # the host syncs are kept apart (sync rows): the runtime table holds 20 + 164 of them
    syncs = Counter(arms.strings[int(i)] for i in arms.launches["api"][~calls])
    assert syncs == {"cudaDeviceSynchronize": 20, "cudaStreamSynchronize": 164}


def test_helper_ranges_are_python_frames_each_enclosing_one_launch(arms: Trace) -> None:
    helper = _ids(arms, lambda n: n.endswith(HELPER_SUFFIX))
    assert len(helper) == 1
    rows = arms.ranges[arms.ranges["name"] == helper[0]]
    assert len(rows) == 256
    assert (rows["kind"] == RangeKind.PYTHON).all()
    launches = arms.launches
    for row in rows:
        inside = (
            (launches["thread"] == row["thread"])
            & (launches["start"] >= row["start"])
            & (launches["start"] <= row["end"])
        )
        assert int(inside.sum()) == 1
    assert "Python NVTX" in PYTHON_NVTX_DOMAINS


def test_helper_ranges_only_in_the_auto_clone_arm(arms: Trace) -> None:
    helper = _ids(arms, lambda n: n.endswith(HELPER_SUFFIX))[0]
    helpers = arms.ranges[arms.ranges["name"] == helper]
    for arm, expect_some in (("auto_clone", True), ("explicit_false", False), ("auto_same", False)):
        windows = arms.ranges[arms.ranges["name"] == arms.strings.lookup(f"nsys_arm:{arm}")]
        assert len(windows) == 2  # one per rank
        inside = sum(
            int(((helpers["start"] >= w["start"]) & (helpers["end"] <= w["end"])).sum())
            for w in windows
        )
        assert (inside > 0) is expect_some


def test_nesting_parents_enclose_children(arms: Trace) -> None:
    r = arms.ranges
    child = np.flatnonzero(r["parent"] >= 0)
    parent = r["parent"][child]
    assert len(child) > 10_000
    assert (r["thread"][parent] == r["thread"][child]).all()
    assert (r["start"][parent] <= r["start"][child]).all()
    assert (r["end"][parent] >= r["end"][child]).all()
    assert (r["depth"][child] == r["depth"][parent] + 1).all()
    assert (r["depth"][r["parent"] < 0] == 0).all()


def test_thread_names_and_span(arms: Trace) -> None:
    autograd = [n for t, n in arms.thread_names.items() if (t & ~0xFFFFFF) in arms.ranks]
    assert "pt_autograd_0" in autograd
    assert arms.span[0] <= int(arms.activities["start"].min())
    assert arms.span[1] >= int(arms.activities["end"].max())
    assert arms.metadata["nsys_version"] == "2025.3.2.0"


def test_single_process_export() -> None:
    trace = read_nsys(SINGLE)
    assert int((trace.activities["kind"] == ActivityKind.KERNEL).sum()) == 121
    assert len(trace.ranges) == 40  # 41 NVTX rows, one of them the domain record
    assert list(trace.ranks.values()) == [0]
    assert "CUPTI_ACTIVITY_KIND_MEMSET" in trace.metadata["absent_tables"]  # type: ignore[operator]
    names = Counter(trace.strings[int(i)] for i in trace.ranges["name"])
    assert names["get_cu_seqlens_on_cp_rank"] == 20
    assert (trace.ranges["kind"] == RangeKind.NVTX).all()


def test_plain_sqlite_and_gzip_read_the_same(tmp_path: Path) -> None:
    plain = read_nsys(_gunzip(SINGLE, tmp_path / "single.sqlite"))
    gz = read_nsys(SINGLE)
    assert np.array_equal(plain.activities, gz.activities)
    assert np.array_equal(plain.ranges, gz.ranges)


def test_gzip_temp_copy_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    read_nsys(SINGLE)
    assert list(scratch.iterdir()) == []


def _edited_copy(tmp_path: Path, *statements: str) -> Path:
    db = _gunzip(SINGLE, tmp_path / "edited.sqlite")
    conn = sqlite3.connect(db)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return db


def test_missing_nvtx_table_degrades_with_a_note(tmp_path: Path) -> None:
    trace = read_nsys(_edited_copy(tmp_path, "DROP TABLE NVTX_EVENTS"))
    assert len(trace.ranges) == 0
    assert "no NVTX_EVENTS table: range attribution unavailable" in trace.notes
    assert int((trace.activities["kind"] == ActivityKind.KERNEL).sum()) == 121


def test_missing_runtime_table_degrades_with_a_note(tmp_path: Path) -> None:
    trace = read_nsys(_edited_copy(tmp_path, "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME"))
    assert len(trace.launches) == 0
    assert any("CUPTI_ACTIVITY_KIND_RUNTIME" in note for note in trace.notes)
    assert len(trace.ranges) == 40


def test_old_export_columns_degrade(tmp_path: Path) -> None:
    db = _edited_copy(
        tmp_path,
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN demangledName",
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN graphNodeId",
        "ALTER TABLE NVTX_EVENTS DROP COLUMN textId",
        "DROP TABLE ENUM_NSYS_EVENT_TYPE",
    )
    trace = read_nsys(db)
    assert any("names from shortName" in note for note in trace.notes)
    assert (trace.activities["graph_node"] == -1).all()
    assert "assumed" in str(trace.metadata["nvtx_event_types"])
    assert len(trace.ranges) == 40
    kernel_names = {trace.strings[int(i)] for i in trace.activities["name"]}
    assert not any(name.startswith("<string") for name in kernel_names)


def test_duplicate_runtime_rows_are_dropped(tmp_path: Path) -> None:
    db = _edited_copy(
        tmp_path,
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, "
        "correlationId, nameId, returnValue) SELECT start + 1, end - 1, eventClass, globalTid, "
        "correlationId, nameId, returnValue FROM CUPTI_ACTIVITY_KIND_RUNTIME "
        "WHERE correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL)",
    )
    clean = read_nsys(SINGLE)
    trace = read_nsys(db)
    assert trace.metadata["duplicate_launch_rows"] == 121
    assert len(trace.launches) == len(clean.launches)
    assert np.array_equal(np.sort(trace.launches["start"]), np.sort(clean.launches["start"]))


def test_both_sqlite_backends_read_the_same(monkeypatch: pytest.MonkeyPatch, arms: Trace) -> None:
    """The Arrow (ADBC) fast path, when installed, must equal the stdlib sqlite3 path."""
    monkeypatch.setenv("CPTRACE_NSYS_BACKEND", "sqlite3")
    plain = read_nsys(THREE_ARMS)
    assert plain.metadata["sqlite_backend"] == "sqlite3"
    for table in ("activities", "launches", "ranges"):
        assert np.array_equal(getattr(plain, table), getattr(arms, table))
    assert plain.strings.names == arms.strings.names


@pytest.mark.parametrize("backend", ["sqlite3", "default"])
def test_values_outside_the_packed_bits_fall_back_to_plain_queries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    if backend == "sqlite3":
        monkeypatch.setenv("CPTRACE_NSYS_BACKEND", "sqlite3")
    db = _edited_copy(
        tmp_path,
        # a device id above 255 and a stream id above 65535 do not fit the packed column
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 300, streamId = 70000 "
        "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)",
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = correlationId + 5000000000 "
        "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId "
        "IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL))",
    )
    trace = read_nsys(db)
    kernels = trace.activities[trace.activities["kind"] == ActivityKind.KERNEL]
    assert len(kernels) == 121
    assert set(kernels["device"].tolist()) == {0, 300}
    assert 70000 in kernels["stream"].tolist()
    assert int(trace.launches["correlation"].max()) > 5_000_000_000


def test_many_distinct_inline_names(tmp_path: Path) -> None:
    """Beyond 64 distinct texts, names leave SQLite row by row and are interned in Python."""
    db = _edited_copy(
        tmp_path,
        "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) "
        "SELECT start, end, 59, (SELECT globalTid FROM NVTX_EVENTS LIMIT 1), "
        "'kernel range ' || rowid || ' it''s quoted' FROM CUPTI_ACTIVITY_KIND_KERNEL",
    )
    trace = read_nsys(db)
    names = Counter(trace.strings[int(i)] for i in trace.ranges["name"])
    assert len(trace.ranges) == 40 + 121
    assert (
        sum(1 for n in names if n.startswith("kernel range ") and n.endswith("it's quoted")) == 121
    )
    assert names["get_cu_seqlens_on_cp_rank"] == 20


def test_process_on_two_devices_ranks_by_process_order(tmp_path: Path) -> None:
    db = _edited_copy(
        tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 1 WHERE rowid % 2 = 0"
    )
    trace = read_nsys(db)
    assert "process order" in str(trace.metadata["rank_source"])
    assert list(trace.ranks.values()) == [0]
    assert (trace.activities["rank"] == 0).all()


def test_name_missing_from_the_sampled_list_rereads_with_all_names(
    arms: Trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inline names are listed from the first rows; a later new name triggers a full listing."""
    from analyzers.readers import _nsys_ranges

    monkeypatch.setattr(_nsys_ranges, "_SAMPLE_ROWS", 1)  # one name sampled: others unknown
    resampled = read_nsys(THREE_ARMS)
    assert len(resampled.ranges) == len(arms.ranges)
    assert [resampled.strings[int(i)] for i in resampled.ranges["name"]] == [
        arms.strings[int(i)] for i in arms.ranges["name"]
    ]
    assert "<unnamed NVTX range>" not in {
        resampled.strings[int(i)] for i in resampled.ranges["name"]
    }


def test_rank_assignment_for_many_processes_agrees(
    arms: Trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sort-based (process, device) pairing for many processes gives the same ranks."""
    from analyzers.readers import nsys

    monkeypatch.setattr(nsys, "_FEW", 0)  # every export now counts as "many processes"
    trace = read_nsys(THREE_ARMS)
    assert trace.ranks == arms.ranks
    assert trace.metadata["rank_source"] == arms.metadata["rank_source"]


@pytest.mark.parametrize("backend", ["sqlite3", "default"])
def test_nvtx_without_text_column_names_ranges_by_text_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    if backend == "sqlite3":
        monkeypatch.setenv("CPTRACE_NSYS_BACKEND", "sqlite3")
    with_text = read_nsys(SINGLE)
    trace = read_nsys(_edited_copy(tmp_path, "ALTER TABLE NVTX_EVENTS DROP COLUMN text"))
    assert len(trace.ranges) == len(with_text.ranges) == 40
    names = [trace.strings[int(i)] for i in trace.ranges["name"]]
    expected = [with_text.strings[int(i)] for i in with_text.ranges["name"]]
    # The export names 20 ranges by textId and 20 by inline text: the textId names survive,
    # the inline ones (no such column now) read as unnamed.
    kept = [n for n, e in zip(names, expected, strict=True) if n == e]
    assert len(kept) == 20
    assert names.count("<unnamed NVTX range>") == 20


def test_huge_page_advice_is_restored_after_reading() -> None:
    """The reader switches numpy's huge-page hint off only while it reads (it is global)."""
    setter = np._core.multiarray._set_madvise_hugepage
    original = setter(True)
    try:
        for wanted in (True, False):
            setter(wanted)
            read_nsys(SINGLE)
            assert setter(wanted) is wanted
    finally:
        setter(original)


@pytest.mark.parametrize("readers", ["2", "3"])
def test_rowid_range_reads_equal_one_connection(
    monkeypatch: pytest.MonkeyPatch, arms: Trace, readers: str
) -> None:
    """Big tables read in rowid ranges by several connections give the same rows, in order."""
    pytest.importorskip("adbc_driver_sqlite")  # the ranges are an Arrow-path feature
    monkeypatch.setattr(_nsys_sql, "SPLIT_ROWS", 8)  # the small export's tables split too
    monkeypatch.setenv("CPTRACE_NSYS_READERS", readers)
    split = read_nsys(THREE_ARMS)
    assert split.metadata["sqlite_backend"] == "adbc"
    for table in ("activities", "launches", "ranges"):
        assert np.array_equal(getattr(split, table), getattr(arms, table))
    assert split.strings.names == arms.strings.names


def test_rowid_cuts_and_range_sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _gunzip(THREE_ARMS, tmp_path / "arms.sqlite")
    monkeypatch.setattr(_nsys_sql, "SPLIT_ROWS", 8)
    monkeypatch.setenv("CPTRACE_NSYS_READERS", "3")
    conn = open_readonly(db)
    try:
        src = _nsys_sql.NsysSource(conn=conn, schema=Schema(path=db), label=str(db))
        table = "CUPTI_ACTIVITY_KIND_KERNEL"
        low, high = conn.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
        cuts = src._rowid_cuts(table)
        assert len(cuts) == 2 and low < cuts[0] < cuts[1] < high
        query = _nsys_sql.Query(f"SELECT start FROM {table}", ("start",), splits=True)
        parts = [
            query.over_rows(lo, hi) for lo, hi in zip([None, *cuts], [*cuts, None], strict=True)
        ]
        assert parts[0].endswith(f"WHERE rowid <= {cuts[0]}")
        assert parts[1].endswith(f"WHERE rowid > {cuts[0]} AND rowid <= {cuts[1]}")
        whole = [r[0] for r in conn.execute(query.sql)]
        assert [r[0] for p in parts for r in conn.execute(p)] == whole
        filtered = _nsys_sql.Query(f"SELECT start FROM {table} WHERE start > 0", ("start",))
        assert filtered.over_rows(1, None).endswith("WHERE start > 0 AND rowid > 1")
        monkeypatch.setenv("CPTRACE_NSYS_READERS", "1")
        assert src._rowid_cuts(table) == []
    finally:
        conn.close()
