"""Kineto times are exact and every JSON layout reads the same rows.

The expected times come from a plain walk of the JSON in the test (``json.loads`` with
``parse_float=Decimal``: the decimal text, never a float), for the real traces in Kineto's own
layout and re-serialized (``indent=1``, compact, ``indent=4`` with sorted keys, CRLF line ends),
and for hand-written traces whose epoch
microseconds do not fit a float's 53 bits.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testkit import DATA_DIR

from analyzers.model import ActivityKind
from analyzers.readers import _json_chunks, kineto
from analyzers.readers.kineto import read_kineto

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

DATA = DATA_DIR
SYNTH = sorted((DATA / "synthetic-h200x2").glob("kineto_rank*.json.gz"))
TE0 = DATA / "te-2.20.2-h200x2" / "kineto_3arms_rank0.json.gz"
ACTIVITY = {"kernel", "gpu_memcpy", "gpu_memset"}
RANGE = {"python_function", "cpu_op", "user_annotation"}


def _ns(value: object) -> int:
    exact = Decimal(str(value)) * 1000
    return int(exact.to_integral_value(ROUND_HALF_EVEN))


def _expected(text: bytes) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]]]:
    """(start, end) ns of the GPU activities and of the range events, from the JSON text."""
    events = json.loads(text, parse_float=Decimal)["traceEvents"]
    acts: Counter[tuple[int, int]] = Counter()
    ranges: Counter[tuple[int, int]] = Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        start = _ns(e["ts"])
        row = (start, start + _ns(e.get("dur", 0)))
        if e.get("cat") in ACTIVITY:
            acts[row] += 1
        elif e.get("cat") in RANGE:
            ranges[row] += 1
    return acts, ranges


def _rows(table: np.ndarray) -> Counter[tuple[int, int]]:
    return Counter(zip(table["start"].tolist(), table["end"].tolist(), strict=True))


def _variants(path: Path, tmp_path: Path) -> list[Path]:
    raw = gzip.decompress(path.read_bytes())
    doc = json.loads(raw)
    own = tmp_path / f"own_{path.name.removesuffix('.gz')}"
    own.write_bytes(raw)
    indented = tmp_path / f"indent1_{own.name}"
    indented.write_text(json.dumps(doc, indent=1))
    compact = tmp_path / f"compact_{own.name}"
    compact.write_text(json.dumps(doc, separators=(",", ":")))
    sorted_keys = tmp_path / f"sorted_{own.name}"
    sorted_keys.write_text(json.dumps(doc, indent=4, sort_keys=True))
    crlf = tmp_path / f"crlf_{own.name}"
    crlf.write_bytes(raw.replace(b"\n", b"\r\n"))
    return [own, indented, compact, sorted_keys, crlf]


PARSERS = {
    "own": "kineto-layout",
    "indent1": "json-chunks",
    "compact": "json-chunks",
    "sorted": "json-chunks",
    "crlf": "json-chunks",
}
"""The path each layout takes with the struct path switched off."""


@pytest.mark.parametrize(
    ("path", "structs"),
    [
        *((p, s) for p in SYNTH for s in (True, False)),
        (TE0, True),  # the real reference rank through the default path only: ~25 s a mode
    ],
    ids=lambda v: v.name if isinstance(v, Path) else ("structs" if v else "layout-or-chunks"),
)
def test_times_equal_the_decimal_text_in_every_layout(
    path: Path, structs: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto, "STRUCTS_PATH", structs)
    traces = []
    expected: dict[str, tuple[Counter[tuple[int, int]], Counter[tuple[int, int]]]] = {}
    for variant in _variants(path, tmp_path):
        trace = read_kineto(variant)
        layout = variant.name.partition("_")[0]
        assert trace.metadata["json_parser"] == ("msgspec-structs" if structs else PARSERS[layout])
        # The Decimal walk (the slow part) once per distinct number text: CRLF only adds
        # whitespace to Kineto's own text (a JSON string holds no raw newline), and the three
        # re-serialized layouts write the same parsed document, each float as its shortest text.
        text = "own" if layout in ("own", "crlf") else "dumped"
        if text not in expected:
            expected[text] = _expected(variant.read_bytes())
        acts, ranges = expected[text]
        assert _rows(trace.activities) == acts
        assert _rows(trace.ranges) == ranges
        traces.append(trace)
    reference = traces[0]
    for other in traces[1:]:  # json.dumps writes each float's shortest text: same values
        for table in ("activities", "launches", "ranges"):
            assert np.array_equal(getattr(reference, table), getattr(other, table)), table
        assert reference.strings.names == other.strings.names


def _layout(events: list[dict[str, Any]]) -> str:
    """Kineto's own line layout (libkineto output_json.cpp), written by hand."""
    parts = []
    for e in events:
        head = (
            f'    "ph": "X", "cat": "{e["cat"]}", "name": {json.dumps(e["name"])}, '
            f'"pid": {e["pid"]}, "tid": {e["tid"]},\n'
            f'    "ts": {e["ts"]}, "dur": {e["dur"]}'
        )
        if "args" in e:
            args = ", ".join(f'"{k}": {v}' for k, v in e["args"].items())
            head += f',\n    "args": {{\n      {args}\n    }}'
        parts.append("  {\n" + head + "\n  }")
    return '{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + ",\n".join(parts) + "\n  ]\n}"


EPOCH_EVENTS: list[dict[str, Any]] = [
    # epoch microseconds with three decimals: 19 digits, beyond a float's 53 bits
    {
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 7,
        "tid": 7,
        "ts": "1764633600123456.789",
        "dur": "12.345",
    },
    {
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 7,
        "tid": 7,
        "ts": "1764633600123460.001",
        "dur": "3.999",
        "args": {"correlation": 5},
    },
    {
        "cat": "kernel",
        "name": 'my "quoted" \\ kernel',
        "pid": 0,
        "tid": 7,
        "ts": "1764633600123470.123",
        "dur": "0.001",
        "args": {"device": 0, "stream": 7, "correlation": 5},
    },
    {
        "cat": "user_annotation",
        "name": "ProfilerStep#1",
        "pid": 7,
        "tid": 7,
        "ts": "1764633600123450",
        "dur": "100",
    },
    {
        "cat": "python_function",
        "name": "x.py(1): f",
        "pid": 7,
        "tid": 7,
        "ts": "5146681463270.6265",
        "dur": "1.0005",
    },  # below a ns: rounds half to even
]


@pytest.mark.parametrize("structs", [True, False], ids=["structs", "layout-or-chunks"])
def test_epoch_microseconds_and_sub_ns_digits_are_exact(
    structs: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto, "STRUCTS_PATH", structs)
    own = tmp_path / "own_rank0.json"
    own.write_text(_layout(EPOCH_EVENTS))
    compact = tmp_path / "compact_rank0.json"  # the same, compact, numbers as the same text
    events = []
    for e in EPOCH_EVENTS:
        fields = [f'"ph":"X","cat":"{e["cat"]}","name":{json.dumps(e["name"])}']
        fields.append(f'"pid":{e["pid"]},"tid":{e["tid"]},"ts":{e["ts"]},"dur":{e["dur"]}')
        if "args" in e:
            fields.append('"args":' + json.dumps(e["args"], separators=(",", ":")))
        events.append("{" + ",".join(fields) + "}")
    compact.write_text('{"traceEvents":[' + ",".join(events) + "]}")
    for path, parser in ((own, "kineto-layout"), (compact, "json-chunks")):
        trace = read_kineto(path)
        assert trace.metadata["json_parser"] == ("msgspec-structs" if structs else parser)
        kernel = trace.activities[trace.activities["kind"] == ActivityKind.KERNEL]
        assert kernel["start"].tolist() == [1764633600123470123]
        assert kernel["end"].tolist() == [1764633600123470124]
        assert trace.name_of(int(kernel["name"][0])) == 'my "quoted" \\ kernel'
        assert trace.launches["start"].tolist() == [1764633600123460001]
        starts = sorted(trace.ranges["start"].tolist())
        assert starts == [5146681463270626, 1764633600123450000, 1764633600123456789]
        ends = sorted(trace.ranges["end"].tolist())
        assert 5146681463270626 + 1000 in ends  # 1.0005 us -> 1000 ns (half to even)
        assert 1764633600123456789 + 12345 in ends


def test_chunk_boundaries_of_the_any_layout_path_do_not_matter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = json.loads(gzip.decompress(SYNTH[0].read_bytes()))
    compact = tmp_path / "kineto_rank0.json"
    compact.write_text(json.dumps(doc, separators=(",", ":")))
    reference = read_kineto(compact)
    monkeypatch.setattr(_json_chunks, "CHUNK_BYTES", 600)  # a few events per chunk
    monkeypatch.setattr(kineto, "STRUCTS_PATH", False)
    monkeypatch.setattr(kineto, "LAYOUT_FAST_PATH", False)
    chunked = read_kineto(compact)
    assert chunked.metadata["json_parser"] == "json-chunks"
    for table in ("activities", "launches", "ranges"):
        assert np.array_equal(getattr(reference, table), getattr(chunked, table)), table
    assert reference.strings.names == chunked.strings.names
