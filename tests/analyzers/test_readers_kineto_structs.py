"""The struct path of the Kineto reader (``_kineto_structs``): the same trace as the scanner.

Its chunks are cut at ``}`` ``,`` ``{``; these tests put that text (and ``}`` ``]``) inside
names and ``args`` with chunks of a few events, move the document's keys around the events,
and feed it what it must refuse (the other paths then read the file, with the same result).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from testkit import DATA_DIR

from analyzers.errors import CorruptTraceError
from analyzers.model import Trace
from analyzers.readers import _files, _kineto_structs, kineto
from analyzers.readers.kineto import read_kineto

SYNTH = DATA_DIR / "synthetic-h200x2" / "kineto_rank0.json.gz"


def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(gzip.decompress(SYNTH.read_bytes()))
    return loaded


def _scanner(path: Path, monkeypatch: pytest.MonkeyPatch) -> Trace:
    with monkeypatch.context() as patch:
        for switch in ("STRUCTS_PATH", "LAYOUT_FAST_PATH", "CHUNKS_PATH"):
            patch.setattr(kineto, switch, False)
        trace = read_kineto(path)
    assert trace.metadata["json_parser"] == "json-scanner"
    return trace


def _without_structs(path: Path, monkeypatch: pytest.MonkeyPatch) -> Trace:
    with monkeypatch.context() as patch:
        patch.setattr(kineto, "STRUCTS_PATH", False)
        return read_kineto(path)


def _assert_same(one: Trace, other: Trace) -> None:
    for table in ("activities", "launches", "ranges", "gpu_ranges"):
        assert np.array_equal(getattr(one, table), getattr(other, table)), table
    assert one.strings.names == other.strings.names
    assert one.thread_names == other.thread_names
    assert (one.span, one.ranks, one.notes) == (other.span, other.ranks, other.notes)
    facts = {k: v for k, v in one.metadata.items() if k != "json_parser"}
    assert facts == {k: v for k, v in other.metadata.items() if k != "json_parser"}


def _write(tmp_path: Path, document: dict[str, Any], **options: Any) -> Path:
    path = tmp_path / "kineto_rank0.json"
    path.write_text(json.dumps(document, **options))
    return path


@pytest.mark.parametrize(
    "options",
    [{"indent": 2}, {"separators": (",", ":")}, {"indent": 1, "sort_keys": True}],
    ids=["indent2", "compact", "indent1-sorted"],
)
def test_cuts_inside_strings_and_args_are_not_taken(
    options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = _document()
    events = document["traceEvents"]
    frames = [e for e in events if e.get("cat") == "python_function"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    for index, frame in enumerate(frames[:40]):
        frame["name"] = f'x}}, {{"ph": "X"}}] }},{{ }}]{index}'
    for op in ops[:40]:  # objects in a list inside args: "}, {" between them
        op["args"]["objects"] = [{"a": 1}, {"b": [{"c": 2}, {}]}]
    path = _write(tmp_path, document, **options)
    monkeypatch.setattr(_kineto_structs, "CHUNK_BYTES", 700)  # a few events per chunk
    monkeypatch.setattr(_files, "READ_BYTES", 97)
    trace = read_kineto(path)
    assert trace.metadata["json_parser"] == "msgspec-structs"
    _assert_same(trace, _scanner(path, monkeypatch))
    assert 'x}, {"ph": "X"}] },{ }]3' in trace.strings.names


def test_keys_around_the_events_and_a_nested_trace_events_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = _document()
    events = document.pop("traceEvents")
    # a "traceEvents" key one level down before the real one, keys after the events
    reordered = {"otherData": {"traceEvents": []}, "first": 1, "traceEvents": events}
    reordered.update(document)
    path = _write(tmp_path, reordered, indent=1)
    trace = read_kineto(path)
    _assert_same(trace, _scanner(path, monkeypatch))
    assert trace.metadata["distributedInfo"] == document["distributedInfo"]
    nested = _write(tmp_path, {"traceEvents": events, **document})  # no key before the events
    assert read_kineto(nested).metadata["json_parser"] == "msgspec-structs"


@pytest.mark.parametrize(
    "edit",
    [
        "a string pid on a range",
        "a null ts",
        "a string ts",
        "an event that is not an object",
        "a float tid",
        "an exponent and a sign",
    ],
)
def test_what_the_struct_path_refuses_reads_like_the_scanner(
    edit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = _document()
    events = document["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    if edit == "a string pid on a range":
        ops[3]["pid"] = str(ops[3]["pid"])
    elif edit == "a null ts":
        ops[3]["ts"] = None
    elif edit == "a string ts":
        ops[3]["ts"] = str(ops[3]["ts"])
    elif edit == "an event that is not an object":
        events.insert(5, 17)
    elif edit == "a float tid":
        ops[3]["tid"] = float(ops[3]["tid"])
    else:
        ops[3]["ts"] = 5.1459142e12
        ops[4]["dur"] = -1.5
    path = _write(tmp_path, document, separators=(",", ":"))
    trace = read_kineto(path)
    if edit == "an exponent and a sign":  # numbers it reads as Decimal, like the scanner
        assert trace.metadata["json_parser"] == "msgspec-structs"
        _assert_same(trace, _scanner(path, monkeypatch))
    else:  # the file is read as if the struct path did not exist
        assert trace.metadata["json_parser"] != "msgspec-structs"
    _assert_same(trace, _without_structs(path, monkeypatch))


def _outcome(path: Path) -> str:
    try:
        return read_kineto(path).metadata["json_parser"]  # type: ignore[return-value]
    except CorruptTraceError as exc:
        return str(exc)


def test_broken_documents_read_as_without_the_struct_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = json.dumps(_document(), indent=2).encode()
    for broken in (text[: len(text) // 2], text + b" {}", text.replace(b'"ph"', b'"ph" "', 1)):
        path = tmp_path / "kineto_rank0.json"
        path.write_bytes(broken)
        with_structs = _outcome(path)
        monkeypatch.setattr(kineto, "STRUCTS_PATH", False)
        assert with_structs == _outcome(path)
        monkeypatch.setattr(kineto, "STRUCTS_PATH", True)
    path.write_bytes(text[: len(text) // 2])
    with pytest.raises(CorruptTraceError, match="malformed JSON"):
        read_kineto(path)


# The tagged decoder (one struct type per category) reads Kineto's own events; every event it
# does not know must make it hand the chunk to the generic decoder, which routes it as the
# scanner does. Each of these is one such event.
_UNTAGGED_EVENTS = {
    "an unknown category": {"ph": "X", "cat": "my_tool", "name": "x", "pid": 1, "tid": 1, "ts": 5},
    "a category in capitals": {
        "ph": "X",
        "cat": "Kernel",
        "name": "k",
        "pid": 0,
        "tid": 7,
        "ts": 10.5,
        "dur": 2,
        "args": {"device": 0, "stream": 7, "correlation": 999999},
    },
    "metadata with a skipped category": {
        "ph": "M",
        "cat": "Trace",
        "name": "thread_name",
        "pid": 1,
        "tid": 4242,
        "args": {"name": "tagged?"},
    },
    "metadata without a category": {
        "ph": "M",
        "name": "thread_name",
        "pid": 1,
        "tid": 4343,
        "args": {"name": "untagged"},
    },
    "a range that is not complete": {
        "ph": "B",
        "cat": "cpu_op",
        "name": "b",
        "pid": 1,
        "tid": 1,
        "ts": 3,
    },
    "a range without pid": {"ph": "X", "cat": "user_annotation", "name": "u", "tid": 1, "ts": 3},
}


def test_the_tagged_decoder_refuses_what_it_does_not_route() -> None:
    for event in _UNTAGGED_EVENTS.values():
        with pytest.raises(msgspec.ValidationError):
            _kineto_structs._TAGGED_DECODER.decode(json.dumps([event]).encode())
        _kineto_structs._DECODER.decode(json.dumps([event]).encode())  # the generic one reads it
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "args": {"device": 0}}
    flow = {"ph": "s", "cat": "ac2g", "id": 3, "pid": "a", "tid": None, "ts": "x", "bp": "e"}
    decoded = _kineto_structs._TAGGED_DECODER.decode(json.dumps([kernel, flow]).encode())
    routes = [_kineto_structs._TYPE_ROUTES[type(event)] for event in decoded]
    assert routes == [_kineto_structs._route("kernel"), _kineto_structs._NONE]


@pytest.mark.parametrize("chunk_bytes", [700, 1 << 20], ids=["small-chunks", "one-chunk"])
def test_events_the_tagged_decoder_refuses_read_like_the_scanner(
    chunk_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = _document()
    events = document["traceEvents"]
    for index, event in enumerate(_UNTAGGED_EVENTS.values()):
        if "pid" not in event and event["cat"] == "user_annotation":
            continue  # a range without pid is refused by the struct path as a whole (below)
        events.insert(50 + 97 * index, event)
    path = _write(tmp_path, document, indent=1)
    monkeypatch.setattr(_kineto_structs, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(_kineto_structs, "MAX_UNTAGGED_CHUNKS", 3)  # then generic only
    trace = read_kineto(path)
    assert trace.metadata["json_parser"] == "msgspec-structs"
    _assert_same(trace, _scanner(path, monkeypatch))
    assert trace.thread_names[4242] == "tagged?" and trace.thread_names[4343] == "untagged"
    assert "k" in trace.strings.names  # the capitalised kernel is an activity, as in the scanner
    events.insert(60, _UNTAGGED_EVENTS["a range without pid"])
    path = _write(tmp_path, document, indent=1)
    assert read_kineto(path).metadata["json_parser"] != "msgspec-structs"
    _assert_same(read_kineto(path), _scanner(path, monkeypatch))
