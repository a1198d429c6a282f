"""One capped inflate: the upload check and every reader accept exactly the same gzip data.

``_files.inflated`` is the one rule (concatenated members are one stream, NUL padding after a
member is ignored, anything else after a member, a damaged or a truncated member is
``CorruptTraceError``, expansion past the cap is ``TraceTooLargeError``). Each variant of a real
trace is put through the upload check (``check_trace``), the Kineto reader and, gzipped the
same way, the nsys export reader: all accept it, or all refuse it with the same error class.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest
from testkit import DATA_DIR

from analyzers.errors import CorruptTraceError, TraceError, TraceTooLargeError
from analyzers.readers import check_trace, read_kineto, read_nsys

KINETO = DATA_DIR / "synthetic-h200x2" / "kineto_rank0.json.gz"
NSYS = DATA_DIR / "synthetic-h200x2" / "nsys_single.sqlite.gz"


def _members(text: bytes) -> bytes:
    third = len(text) // 3
    return b"".join(
        gzip.compress(part) for part in (text[:third], text[third : 2 * third], text[2 * third :])
    )


VARIANTS: dict[str, tuple[Callable[[bytes], bytes], type[TraceError] | None]] = {
    "plain gzip": (gzip.compress, None),
    "1 KiB of trailing NULs": (lambda t: gzip.compress(t) + bytes(1024), None),
    "concatenated members": (_members, None),
    "NULs between members": (
        lambda t: gzip.compress(t[:999]) + bytes(7) + gzip.compress(t[999:]),
        None,
    ),
    "truncated": (lambda t: gzip.compress(t)[:-9], CorruptTraceError),
    "truncated inside the data": (
        lambda t: (z := gzip.compress(t))[: len(z) // 2],
        CorruptTraceError,
    ),
    "trailing garbage": (lambda t: gzip.compress(t) + b"garbage", CorruptTraceError),
    "NULs then garbage": (lambda t: gzip.compress(t) + bytes(16) + b"x", CorruptTraceError),
    "a lone magic byte after the data": (lambda t: gzip.compress(t) + b"\x1f", CorruptTraceError),
    "damaged CRC": (lambda t: (z := gzip.compress(t))[:-8] + bytes(4) + z[-4:], CorruptTraceError),
}


def _outcome(read: Callable[[], object]) -> type[TraceError] | None:
    try:
        read()
    except TraceError as exc:
        return type(exc)
    return None


@pytest.fixture(scope="module")
def texts() -> dict[str, bytes]:
    return {
        "kineto": gzip.decompress(KINETO.read_bytes()),
        "nsys": gzip.decompress(NSYS.read_bytes()),
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_check_and_readers_accept_the_same_gzip_data(
    variant: str, texts: dict[str, bytes], tmp_path: Path
) -> None:
    make, expected = VARIANTS[variant]
    kineto = tmp_path / "kineto_rank0.json.gz"
    kineto.write_bytes(make(texts["kineto"]))
    nsys = tmp_path / "nsys_single.sqlite.gz"
    nsys.write_bytes(make(texts["nsys"]))
    outcomes = {
        "check kineto": _outcome(lambda: check_trace(kineto, label="kineto_rank0.json.gz")),
        "read kineto": _outcome(lambda: read_kineto(kineto)),
        "check nsys": _outcome(lambda: check_trace(nsys, label="nsys_single.sqlite.gz")),
        "read nsys": _outcome(lambda: read_nsys(nsys)),
    }
    assert outcomes == dict.fromkeys(outcomes, expected)


def test_the_cap_is_the_callers_everywhere(texts: dict[str, bytes], tmp_path: Path) -> None:
    kineto = tmp_path / "kineto_rank0.json.gz"
    kineto.write_bytes(gzip.compress(texts["kineto"]))
    nsys = tmp_path / "nsys_single.sqlite.gz"
    nsys.write_bytes(gzip.compress(texts["nsys"]))
    small = 100_000
    outcomes = {
        "check kineto": _outcome(lambda: check_trace(kineto, max_bytes=small)),
        "read kineto": _outcome(lambda: read_kineto(kineto, max_decompressed_bytes=small)),
        "check nsys": _outcome(lambda: check_trace(nsys, max_bytes=small)),
        "read nsys": _outcome(lambda: read_nsys(nsys, max_decompressed_bytes=small)),
    }
    assert outcomes == dict.fromkeys(outcomes, TraceTooLargeError)
    exact = len(texts["kineto"])
    assert read_kineto(kineto, max_decompressed_bytes=exact).metadata["json_parser"]
    assert (
        _outcome(lambda: read_kineto(kineto, max_decompressed_bytes=exact - 1))
        is TraceTooLargeError
    )


def test_no_environment_read_sets_the_cap(
    texts: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap is an argument (the service passes its Settings), never the environment."""
    monkeypatch.setenv("CPTRACE_MAX_DECOMPRESSED_BYTES", "1000")
    kineto = tmp_path / "kineto_rank0.json.gz"
    kineto.write_bytes(gzip.compress(texts["kineto"]))
    assert _outcome(lambda: read_kineto(kineto)) is None
    assert _outcome(lambda: check_trace(kineto)) is None
