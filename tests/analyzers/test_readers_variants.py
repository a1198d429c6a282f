"""No traceback on any valid trace: every optional table, column and event kind, dropped.

From each real export (``tests/data``, ``tests/data/openworld``, and the folder
``--shared-traces`` / ``$CPTRACE_SHARED_TRACES`` names when given) variants
are generated that drop one optional piece each:

* nsys: each table the reader reads (one at a time), all ``TARGET_INFO_*`` / ``ENUM_*`` tables
  at once, each column of each table the reader reads (the table rebuilt without it), and
  ``StringIds`` rows the other tables still reference;
* Kineto: ``distributedInfo``, each event category, the ``ProfilerStep#N`` events, ``ts`` and
  ``dur`` as integers, ``displayTimeUnit`` "ns", and other JSON layouts (``indent=1``, compact).

Every variant goes through the real CLI (``cptrace analyze --json``): it must either analyse
(exit 0, a report) or end with a one-line ``Error: ...`` (exit 1). The small traces get every
variant; the big ones (the TE reference run) a sample, to keep the run time near half a minute.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit import DATA_DIR, shared_traces_dir
from typer.testing import CliRunner

from cptrace.cli import app

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

DATA_DIRS = [d for d in (DATA_DIR, shared_traces_dir()) if d is not None]
SMALL_BYTES = 100 << 10
"""Compressed size up to which a trace gets every variant (the bigger ones get a sample)."""
KEY_COLUMNS = {
    "start",
    "end",
    "correlationId",
    "globalPid",
    "globalTid",
    "deviceId",
    "streamId",
    "demangledName",
    "shortName",
    "nameId",
    "copyKind",
    "bytes",
    "graphNodeId",
    "eventType",
    "text",
    "textId",
    "domainId",
    "id",
    "value",
    "name",
    "label",
}
"""Columns dropped one by one in every small export; the smallest export loses every column of
every table the reader reads, one at a time (about a hundred variants)."""
READ_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_DRIVER",
    "NVTX_EVENTS",
    "StringIds",
    "ThreadNames",
    "ENUM_NSYS_EVENT_TYPE",
    "ENUM_CUDA_MEMCPY_OPER",
    "META_DATA_EXPORT",
    "TARGET_INFO_GPU",
)
"""Tables the nsys reader queries (``analyzers.readers.nsys.READ_TABLES``, listed here so the
test does not take its expectations from the code under test)."""
KINETO_CATS = (
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "user_annotation",
    "cpu_op",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
)
RUNNER = CliRunner()


def _real_traces() -> list[Path]:
    """Every real trace once (the shared copies equal the test data: deduplicated by content)."""
    seen: set[str] = set()
    found = []
    for base in DATA_DIRS:
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or not path.name.endswith((".json.gz", ".json", ".sqlite.gz")):
                continue
            if path.name == "manifest.json":  # a run bundle's manifest, not a trace
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest not in seen:
                seen.add(digest)
                found.append(path)
    return found


TRACES = _real_traces()
NSYS = [p for p in TRACES if p.name.endswith(".sqlite.gz")]
KINETO = [p for p in TRACES if p.name.endswith((".json.gz", ".json"))]


def _small(path: Path) -> bool:
    return path.stat().st_size <= SMALL_BYTES


def _analyse(path: Path) -> dict[str, Any] | None:
    """Run ``cptrace analyze --json``; the report, or None after a one-line ``Error:``."""
    result = RUNNER.invoke(app, ["analyze", str(path), "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{path.name}: traceback: {result.exception!r}\n{result.output[-2000:]}"
    )
    assert "Traceback" not in result.output, result.output[-2000:]
    if result.exit_code == 0:
        report: dict[str, Any] = json.loads(result.output)
        return report
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output[-2000:]
    return None


# ------------------------------------------------------------------------------------- nsys


def _tables(db: Path) -> dict[str, list[str]]:
    with sqlite3.connect(db) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: [c[1] for c in conn.execute(f'PRAGMA table_info("{n}")')] for n in names}


def _nsys_edits(db: Path, exhaustive: bool, columns: bool) -> Iterator[tuple[str, list[str]]]:
    """(variant name, SQL statements) for one export."""
    tables = _tables(db)
    present = [t for t in READ_TABLES if t in tables]
    for table in present:
        yield f"drop-{table}", [f'DROP TABLE "{table}"']
    for prefix in ("TARGET_INFO_", "ENUM_"):
        group = [t for t in tables if t.startswith(prefix)]
        yield f"drop-{prefix}*", [f'DROP TABLE "{t}"' for t in group]
    yield (
        "no-gpu-activity",
        [f'DROP TABLE "{t}"' for t in present if t.startswith("CUPTI_ACTIVITY_KIND_")],
    )
    yield "StringIds-missing-rows", ["DELETE FROM StringIds WHERE id % 3 = 0"]
    if "NVTX_EVENTS" in tables:
        yield "nvtx-open-ranges", ['UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid % 5 = 0']
    if not exhaustive:
        return
    for table in present:
        for column in tables[table]:
            if not columns and column not in KEY_COLUMNS:
                continue
            keep = ", ".join(f'"{c}"' for c in tables[table] if c != column)
            if not keep:
                continue
            yield (
                f"{table}-without-{column}",
                [
                    f'CREATE TABLE "_new" AS SELECT {keep} FROM "{table}"',
                    f'DROP TABLE "{table}"',
                    f'ALTER TABLE "_new" RENAME TO "{table}"',
                ],
            )


SAMPLE_NSYS = {
    "drop-NVTX_EVENTS",
    "drop-CUPTI_ACTIVITY_KIND_RUNTIME",
    "drop-CUPTI_ACTIVITY_KIND_KERNEL",
    "drop-StringIds",
    "no-gpu-activity",
}
"""Variants of the big exports (each analysis of the TE reference export takes about a second)."""


def _nsys_cases() -> list[tuple[Path, str, list[str]]]:
    cases = []
    smallest = min(NSYS, key=lambda p: p.stat().st_size)
    for path in NSYS:
        with gzip.open(path) as fh:
            head = fh.read(1 << 20)
        if not head.startswith(b"SQLite format 3"):
            continue
        exhaustive = _small(path)
        # A folder of this process's own: every xdist worker collects at the same time.
        with tempfile.TemporaryDirectory(prefix="cptrace-variants-") as tmp:
            db = Path(tmp) / "probe.sqlite"
            with gzip.open(path) as src, open(db, "wb") as out:
                shutil.copyfileobj(src, out)
            for name, sql in _nsys_edits(db, exhaustive, columns=path == smallest):
                if exhaustive or name in SAMPLE_NSYS:
                    cases.append((path, name, sql))
    return cases


NSYS_CASES = _nsys_cases()


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    cache: dict[Path, Path] = {}
    base = tmp_path_factory.mktemp("nsys")

    def get(path: Path) -> Path:
        if path not in cache:
            out = base / f"{len(cache)}.sqlite"
            with gzip.open(path) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            cache[path] = out
        return cache[path]

    return get


@pytest.mark.parametrize(
    ("path", "name", "sql"),
    NSYS_CASES,
    ids=[f"{p.parent.name}/{p.name}:{n}" for p, n, _ in NSYS_CASES],
)
def test_nsys_variant_analyses_or_fails_in_one_line(
    path: Path, name: str, sql: list[str], unpacked: Callable[[Path], Path], tmp_path: Path
) -> None:
    db = tmp_path / f"{name}.sqlite"
    shutil.copyfile(unpacked(path), db)
    with sqlite3.connect(db) as conn:
        for statement in sql:
            conn.execute(statement)
    report = _analyse(db)
    if name in ("drop-NVTX_EVENTS", "drop-CUPTI_ACTIVITY_KIND_RUNTIME"):
        assert report is not None, f"{name}: a valid export without that table must analyse"
        table = name.removeprefix("drop-")
        assert any(table in note for note in report["notes"]), report["notes"]
    if name == "drop-CUPTI_ACTIVITY_KIND_KERNEL" and report is not None:
        assert any("KERNEL" in note for note in report["notes"]), report["notes"]


# ----------------------------------------------------------------------------------- Kineto


def _load(path: Path) -> dict[str, Any]:
    raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    doc: dict[str, Any] = json.loads(raw)
    return doc


def _without_cat(cat: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != cat]

    return edit


def _without_steps(doc: dict[str, Any]) -> None:
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]


def _integer_times(doc: dict[str, Any]) -> None:
    for event in doc["traceEvents"]:
        for key in ("ts", "dur"):
            if isinstance(event.get(key), float):
                event[key] = int(event[key])


def _pop(key: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc.pop(key, None)

    return edit


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc[key] = value

    return edit


def _keep(_: dict[str, Any]) -> None:
    return None


KINETO_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "no-distributedInfo": _pop("distributedInfo"),
    "no-deviceProperties": _pop("deviceProperties"),
    **{f"no-{cat}": _without_cat(cat) for cat in KINETO_CATS},
    "no-ProfilerStep": _without_steps,
    "integer-ts": _integer_times,
    "displayTimeUnit-ns": _set("displayTimeUnit", "ns"),
    "indent-1": _keep,
    "compact": _keep,
}
SAMPLE_KINETO = {"no-python_function", "indent-1"}
LAYOUTS = {"indent-1": {"indent": 1}, "compact": {"separators": (",", ":")}}


def _kineto_cases() -> list[tuple[Path, str]]:
    return [
        (path, name)
        for path in KINETO
        for name in KINETO_EDITS
        if _small(path) or name in SAMPLE_KINETO
    ]


KINETO_CASES = _kineto_cases()


@pytest.mark.parametrize(
    ("path", "name"),
    KINETO_CASES,
    ids=[f"{p.parent.name}/{p.name}:{n}" for p, n in KINETO_CASES],
)
def test_kineto_variant_analyses_or_fails_in_one_line(
    path: Path, name: str, tmp_path: Path
) -> None:
    doc = _load(path)
    KINETO_EDITS[name](doc)
    # the rank stays in the file name (rank<N>) unless distributedInfo is what is tested
    out = tmp_path / (path.name.removesuffix(".gz") if name != "no-distributedInfo" else "p.json")
    if "distributedInfo" not in doc and "rank" not in out.name:
        out = tmp_path / "profile.json"
    out.write_text(json.dumps(doc, **LAYOUTS.get(name, {})))  # type: ignore[arg-type]
    report = _analyse(out)
    if name in ("no-distributedInfo", "indent-1", "compact", "integer-ts", "displayTimeUnit-ns"):
        assert report is not None, f"{name}: a valid trace must analyse"
    if name == "no-distributedInfo":
        assert report is not None and report["ranks"] == [0]
