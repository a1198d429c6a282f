"""Bad and hostile inputs: each gets a specific TraceError that names the file."""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import stat
import sys
from pathlib import Path

import pytest
from testkit import DATA_DIR

from analyzers.errors import (
    CorruptTraceError,
    HostileTraceError,
    MissingRankError,
    RankConflictError,
    TraceError,
    UnsupportedTraceError,
)
from analyzers.readers import read_kineto, read_nsys, read_trace, read_traces

DATA = DATA_DIR
SINGLE = DATA / "synthetic-h200x2" / "nsys_single.sqlite.gz"
KINETO0 = DATA / "synthetic-h200x2" / "kineto_rank0.json.gz"
KINETO1 = DATA / "synthetic-h200x2" / "kineto_rank1.json.gz"


def _gunzip(src: Path, dst: Path) -> Path:
    with gzip.open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    return dst


def _truncated(src: Path, dst: Path, keep: float = 0.5) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


def _nsys_copy_with(tmp_path: Path, statement: str) -> Path:
    db = _gunzip(SINGLE, tmp_path / "export.sqlite")
    conn = sqlite3.connect(db)
    conn.execute(statement)
    conn.commit()
    conn.close()
    return db


def test_errors_are_value_errors() -> None:
    for cls in (
        UnsupportedTraceError,
        CorruptTraceError,
        HostileTraceError,
        RankConflictError,
        MissingRankError,
    ):
        assert issubclass(cls, TraceError)
        assert issubclass(cls, ValueError)


@pytest.mark.parametrize("source", [SINGLE, KINETO0], ids=["nsys", "kineto"])
def test_truncated_gzip_is_corrupt(tmp_path: Path, source: Path) -> None:
    bad = _truncated(source, tmp_path / source.name)
    with pytest.raises(CorruptTraceError, match=str(bad)):
        read_trace(bad)


def test_json_that_is_not_a_trace(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"model": "llama", "layers": [1, 2, 3]}')
    with pytest.raises(UnsupportedTraceError, match="no 'traceEvents'"):
        read_trace(bad)


def test_text_that_is_not_json_or_sqlite(tmp_path: Path) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text("hello, this is not a trace")
    with pytest.raises(UnsupportedTraceError, match=str(bad)):
        read_trace(bad)


def test_malformed_json_in_the_middle(tmp_path: Path) -> None:
    bad = tmp_path / "trace_rank0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel"}, {"ph": "X",, }]}')
    with pytest.raises(CorruptTraceError, match="malformed JSON at character"):
        read_kineto(bad)


def test_sqlite_that_is_not_an_nsys_export(tmp_path: Path) -> None:
    db = tmp_path / "app.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(UnsupportedTraceError, match="not an nsys export"):
        read_trace(db)


def test_sqlite_extension_without_sqlite_content(tmp_path: Path) -> None:
    fake = tmp_path / "export.sqlite"
    fake.write_bytes(b"\x00" * 200)
    with pytest.raises(UnsupportedTraceError, match="not an SQLite database"):
        read_nsys(fake)


def test_export_with_a_trigger_is_refused(tmp_path: Path) -> None:
    db = _nsys_copy_with(
        tmp_path,
        "CREATE TRIGGER evil AFTER INSERT ON StringIds BEGIN DELETE FROM StringIds; END",
    )
    with pytest.raises(HostileTraceError, match="trigger 'evil'"):
        read_trace(db)


def test_export_with_a_view_is_refused(tmp_path: Path) -> None:
    db = _nsys_copy_with(tmp_path, "CREATE VIEW shadow AS SELECT * FROM StringIds")
    with pytest.raises(HostileTraceError, match="view 'shadow'"):
        read_trace(db)


def test_export_with_a_generated_column_is_refused(tmp_path: Path) -> None:
    db = _nsys_copy_with(
        tmp_path,
        "ALTER TABLE StringIds ADD COLUMN shout TEXT GENERATED ALWAYS AS (upper(value)) VIRTUAL",
    )
    with pytest.raises(HostileTraceError, match="generated columns"):
        read_trace(db)


def test_hostile_file_is_left_unchanged(tmp_path: Path) -> None:
    db = _nsys_copy_with(tmp_path, "CREATE VIEW shadow AS SELECT * FROM StringIds")
    before = db.read_bytes()
    with pytest.raises(HostileTraceError):
        read_trace(db)
    assert db.read_bytes() == before


def test_decompression_cap(tmp_path: Path) -> None:
    with pytest.raises(HostileTraceError, match="more than the limit of 4096 bytes"):
        read_nsys(SINGLE, max_decompressed_bytes=4096)


@pytest.mark.parametrize(
    "content", [b"", b'{"traceEvents": []}', b"[]"], ids=["empty", "obj", "arr"]
)
def test_empty_traces(tmp_path: Path, content: bytes) -> None:
    empty = tmp_path / "trace_rank0.json"
    empty.write_bytes(content)
    with pytest.raises(CorruptTraceError, match="no events"):
        read_trace(empty)


def test_nsys_export_without_event_tables(tmp_path: Path) -> None:
    db = _gunzip(SINGLE, tmp_path / "export.sqlite")
    conn = sqlite3.connect(db)
    for table in (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "NVTX_EVENTS",
    ):
        conn.execute(f"DROP TABLE {table}")
    conn.commit()
    conn.close()
    with pytest.raises(CorruptTraceError, match="no events"):
        read_trace(db)


def test_two_files_claiming_one_rank(tmp_path: Path) -> None:
    twin = tmp_path / "kineto_rank1.json.gz"  # the name says rank 1, distributedInfo says 0
    shutil.copyfile(KINETO0, twin)
    with pytest.raises(RankConflictError, match="rank 0"):
        read_traces([KINETO0, twin])


def test_missing_rank_is_a_note_or_an_error() -> None:
    trace = read_traces([KINETO0])
    assert any("world_size is 2" in note and "rank(s) 1" in note for note in trace.notes)
    with pytest.raises(MissingRankError, match="rank"):
        read_traces([KINETO0], require_all_ranks=True)


def test_kineto_rank_from_file_name_else_rank_0_for_a_lone_file(tmp_path: Path) -> None:
    body = (
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, '
        '"tid": 1, "ts": 10.5, "dur": 2}]}'
    )
    named = tmp_path / "worker_rank3.json"
    named.write_text(body)
    assert read_kineto(named).rank_list() == [3]
    anonymous = tmp_path / "trace.json"
    anonymous.write_text(body)
    raw = read_kineto(anonymous)
    assert raw.rank_list() == [-1] and raw.metadata["rank_source"] == "unknown"
    lone = read_trace(anonymous)
    assert lone.rank_list() == [0]
    assert any("analysed as rank 0" in n and "--rank N" in n for n in lone.notes)
    assert read_trace(anonymous, rank=5).rank_list() == [5]
    assert read_kineto(anonymous, rank=5).rank_list() == [5]
    other = tmp_path / "other.json"
    other.write_text(body)
    with pytest.raises(UnsupportedTraceError, match=r"cannot tell the rank.*--rank N"):
        read_traces([anonymous, other])
    with pytest.raises(UnsupportedTraceError, match="one trace file, but 2 were given"):
        read_traces([named, other], rank=1)


def test_nsys_rep_without_nsys_says_how_to_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rep = tmp_path / "profile.nsys-rep"
    rep.write_bytes(b"not really a report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(UnsupportedTraceError, match="nsys export --type sqlite"):
        read_trace(rep)


def test_nsys_rep_with_nsys_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``nsys`` that "exports" by copying a real export checks the whole path."""
    export = _gunzip(SINGLE, tmp_path / "prepared.sqlite")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        "args = sys.argv[1:]\n"
        "assert args[:3] == ['export', '--type', 'sqlite'], args\n"
        f"shutil.copyfile({str(export)!r}, args[args.index('--output') + 1])\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    rep = tmp_path / "profile.nsys-rep"
    rep.write_bytes(b"report")
    trace = read_trace(rep)
    assert trace.format == "nsys"
    assert len(trace.ranges) == 40
    assert trace.source == str(rep)
