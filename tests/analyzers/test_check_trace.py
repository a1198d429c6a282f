"""The upload check (``check_trace``), the one sniffer, strict manifest JSON, saved reports."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from testkit import DATA_DIR, demo_bundles_dir
from typer.testing import CliRunner

from analyzers import analyze
from analyzers.errors import (
    CorruptTraceError,
    HostileTraceError,
    TraceError,
    TraceTooLargeError,
    UnsupportedTraceError,
)
from analyzers.manifest import ManifestError, load_json_strict, parse_manifest
from analyzers.readers import _check as check_module
from analyzers.readers import check_trace, sniff
from cptrace.cli import app as cli_app

DATA = DATA_DIR
KINETO = DATA / "te-2.20.2-h200x2" / "kineto_3arms_rank0.json.gz"
NSYS = DATA / "te-2.20.2-h200x2" / "nsys_3arms.sqlite.gz"
SYNTH = demo_bundles_dir()


@pytest.mark.parametrize("path", [KINETO, NSYS], ids=["kineto", "nsys"])
def test_real_traces_pass_and_say_what_they_are(path: Path) -> None:
    checked = check_trace(path, label="upload")
    assert checked.gzipped and checked.format == ("kineto" if "kineto" in path.name else "nsys")


@pytest.mark.parametrize(
    ("text", "error", "words"),
    [
        (b"{}", CorruptTraceError, "no traceEvents"),
        (b'{"traceEvents": 5}', CorruptTraceError, "traceEvents is not a list"),
        (b'{"traceEvents": [1, 2]}', CorruptTraceError, "traceEvents[0]"),
        (b'{"traceEvents": [', CorruptTraceError, "ends early"),
        (b'{"traceEvents": [{"ts": NaN}]}', CorruptTraceError, "NaN"),
        (b'{"traceEvents": [{"a": ' + b"[" * 5000, CorruptTraceError, "nested deeper"),
        (b'{"traceEvents": []} trailing', CorruptTraceError, "after the end"),
        (b"plain text", UnsupportedTraceError, "not a supported trace"),
    ],
)
def test_structural_check_refuses_with_a_one_line_reason(
    tmp_path: Path, text: bytes, error: type[TraceError], words: str
) -> None:
    path = tmp_path / "server-side-name"
    path.write_bytes(text)
    with pytest.raises(error) as caught:
        check_trace(path, label="rank0.json")
    message = str(caught.value)
    assert message.startswith("rank0.json: ") and words in message
    assert str(tmp_path) not in message, "messages name the upload, never a server path"


def test_the_check_reads_a_prefix_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bomb is refused after the check's prefix, never expanded; a valid head is enough."""
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (64 << 20), compresslevel=9))
    monkeypatch.setattr(check_module, "MAX_PREFIX_BYTES", 1 << 20)
    with pytest.raises(TraceTooLargeError, match="limit of the upload check"):
        check_trace(bomb, label="bomb.json.gz")
    head_then_garbage = tmp_path / "t.json"
    events = ",".join(f'{{"ph": "X", "ts": {i}}}' for i in range(check_module.CHECK_EVENTS))
    head_then_garbage.write_text('{"traceEvents": [' + events + ", not json at all")
    assert check_trace(head_then_garbage).format == "kineto"


def test_sqlite_with_a_trigger_is_hostile(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "x.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE StringIds (id INTEGER, value TEXT);"
        "CREATE TRIGGER t AFTER INSERT ON StringIds BEGIN SELECT 1; END;"
    )
    conn.close()
    with pytest.raises(HostileTraceError, match="trigger"):
        check_trace(path, label="a.sqlite")


def test_sqlite_without_nsys_tables_is_refused(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "x.sqlite"
    sqlite3.connect(path).executescript("CREATE TABLE other (id INTEGER);")
    with pytest.raises(UnsupportedTraceError, match="not an Nsight Systems export"):
        check_trace(path, label="a.sqlite")


def test_manifest_json_is_strict_and_bounded() -> None:
    with pytest.raises(ManifestError, match="NaN is not a JSON number"):
        load_json_strict(b'{"workload": {"cp_size": NaN}}', source="manifest.json")
    with pytest.raises(ManifestError, match="Infinity"):
        load_json_strict(b'{"x": -Infinity}', source="manifest.json")
    with pytest.raises(ManifestError, match="nested deeper than 64"):
        load_json_strict(b'{"x": ' + b"[" * 1200 + b"]" * 1200 + b"}", source="manifest.json")
    assert load_json_strict(b'{"x": "[[[[["}', source="m") == {"x": "[[[[["}
    with pytest.raises(ManifestError, match=r"variants\.0\.name"):
        parse_manifest({"variants": [{"name": "x" * 201}]}, source="manifest.json")


def _saved_report(tmp_path: Path, name: str, text: str, *, gz: bool = False) -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def test_a_saved_report_is_recognised_by_content_and_accepted_like_a_trace(
    tmp_path: Path,
) -> None:
    text = analyze(SYNTH / "synthetic-h200x2-kineto.tar.gz").model_dump_json(indent=2)
    path = _saved_report(tmp_path, "anything.txt", text)
    assert sniff(path) == "report"
    assert check_trace(path).format is None  # a report, not a trace format
    assert analyze(path).model_dump_json(indent=2) == text
    zipped = _saved_report(tmp_path, "report.gz", text, gz=True)
    assert sniff(zipped) == "report" and analyze([zipped]).model_dump_json(indent=2) == text
    with pytest.raises(UnsupportedTraceError, match="give it alone"):
        analyze([path, KINETO])
    cli = CliRunner().invoke(cli_app, ["analyze", str(path), "--json", "--full"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output) == json.loads(text)
    compared = CliRunner().invoke(cli_app, ["compare", "--base", str(path), "--head", str(zipped)])
    assert compared.exit_code == 0, compared.output


def test_a_damaged_report_is_a_corrupt_trace(tmp_path: Path) -> None:
    path = tmp_path / "r"
    path.write_text('{"schema_version": 1, "catalog_version": "x", "sources": 5}')
    with pytest.raises(CorruptTraceError, match="not a valid cptrace report"):
        analyze(path)


def test_tokens_across_any_chunk_boundaries_equal_one_pass() -> None:
    """Long whitespace runs and long strings cut anywhere give the tokens of one whole pass
    (the tokenizer carries neither whitespace nor re-reads an open string per chunk)."""
    import random

    rng = random.Random(7)
    pieces = [
        "{", '"traceEvents"', ":", "[", " " * 7000, '"' + "x" * 20000 + '"', ",",
        '{"ph": "X", "ts": 12.5, "name": "a\\"b"}', "\n\t " * 3000, "true", "null", "-1.5e3",
        '"' + "y\\\\" * 5000 + '"', "]", "}", "\u00a0", " ",
    ]
    for trial in range(30):
        text = "".join(rng.choice(pieces) for _ in range(30))
        cuts = sorted(rng.sample(range(1, len(text)), min(60, len(text) - 1)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        one_pass = [m.group() for m in check_module._TOKEN.finditer(text)]
        assert list(check_module._tokens(iter(chunks))) == one_pass, trial
