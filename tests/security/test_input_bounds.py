"""A small upload may not buy a large cost: the upload check and the manifest parser are linear
(issue 24, items 5 and 8)."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from analyzers.errors import TraceTooLargeError
from analyzers.manifest import load_json_strict
from analyzers.readers import check_trace
from analyzers.readers._check import _tokens

SAMPLES = [
    '{"traceEvents": [{"name": "a\\\\\\"b\\u00e9", "ph": "X", "ts": 1.5e3, "dur": -2}]}',
    '{"k": "\\\\", "l": ["\\"", "x\\\\\\\\", true, false, null, 0, -0.25E+7]}',
    '["é ünï", "tab\\there", {"": ""}, "\\\\\\\\\\""]',
    '{"cut": "abc',  # unterminated
]


@pytest.mark.parametrize("text", SAMPLES)
def test_tokens_are_the_same_however_the_text_is_cut(text: str) -> None:
    whole = list(_tokens(iter([text])))
    for size in range(1, 9):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        assert list(_tokens(iter(chunks))) == whole, size


def _trace_with_name(path: Path, length: int) -> Path:
    head = '{"traceEvents": [{"ph": "X", "name": "'
    tail = '", "ts": 1, "dur": 1, "pid": 0, "tid": 0}]}'
    path.write_text(head + "k" * length + tail)
    return path


def test_a_10_mb_string_is_checked_in_one_pass(tmp_path: Path) -> None:
    """Before: every 64 KiB chunk re-scanned the whole string carried so far (quadratic: a
    5.4 KB gzip held a validation process 45 s). Generous bound; the benchmark has numbers."""
    big = _trace_with_name(tmp_path / "big.json", 10 * 1024 * 1024)
    tracemalloc.start()
    started = time.process_time()  # CPU time: the quadratic scan was CPU, and wall time
    with pytest.raises(TraceTooLargeError):  # over the check's 8 MiB prefix, found early
        check_trace(big, label="big.json")
    elapsed = time.process_time() - started  # grows with the machine's load, CPU time does not
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 10, f"{elapsed:.1f} s of CPU for one pass over 10 MB"
    assert peak < 4 * 10 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"
    fits = _trace_with_name(tmp_path / "fits.json", 6 * 1024 * 1024)
    assert check_trace(fits, label="fits.json") is not None


def test_manifest_strict_json_memory_is_linear() -> None:
    """Before: the string regex's backtracking took ~120x the manifest (8 MB -> 1 GiB)."""
    text = json.dumps({"run": {"name": "x", "note": "y" * (8 * 1024 * 1024)}})
    tracemalloc.start()
    value = load_json_strict(text, source="manifest.json")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert isinstance(value, dict)
    assert peak < 3 * len(text), f"peak {peak / len(text):.1f}x the manifest"
