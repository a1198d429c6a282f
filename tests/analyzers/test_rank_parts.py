"""Typed analysis inputs and the per-rank analysis (issue 26 seam 1, issue 27 item 4).

Every trace set in tests/data: typed inputs give the report bare paths give, without sniffing
again; per-rank parts, each written to a blob and read back, merge into the report of the
one-process analysis, byte for byte.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testkit import DATA_DIR, shared_traces_dir
from testkit.calls import calls_of

from analyzers.bundle import read_bundle
from analyzers.errors import CorruptTraceError, UnsupportedTraceError
from analyzers.pipeline import analyze
from analyzers.rank_parts import (
    PART_VERSION,
    RankPart,
    analyze_rank,
    dump_part,
    load_part,
    merge_part_blobs,
    merge_parts,
    read_part_header,
)
from analyzers.readers import TraceInput, _files, check_trace, trace_input
from tests.analyzers.conftest import KINETO_3ARMS, NSYS_3ARMS, te_manifest

SYNTHETIC = DATA_DIR / "synthetic-h200x2"
OPENWORLD = DATA_DIR / "openworld"
BUNDLE = DATA_DIR / "cpu-gloo" / "cpu_smoke.tar.gz"
PROFILE_BUNDLE = DATA_DIR / "te-2.20.2-h200-profile"
PLAIN_BUNDLE = DATA_DIR / "plain-h200-profile" / "plain_mlp_adamw.tar.gz"

TRACE_SETS = {
    "synthetic-kineto-pair": [
        SYNTHETIC / "kineto_rank0.json.gz",
        SYNTHETIC / "kineto_rank1.json.gz",
    ],
    "synthetic-nsys": [SYNTHETIC / "nsys_single.sqlite.gz"],
    "te-kineto-3arms": KINETO_3ARMS,
    "te-nsys-3arms": [NSYS_3ARMS],
    **{f"openworld-{p.name}": [p] for p in sorted(OPENWORLD.glob("*.gz"))},
}
MANIFESTS = {
    "te-kineto-3arms": lambda: te_manifest("arm"),
    "te-nsys-3arms": lambda: te_manifest("nsys_arm", steps_per_window=3),
}
MULTI_RANK = ["synthetic-kineto-pair", "te-kineto-3arms", "te-nsys-3arms"]
BUNDLES = [BUNDLE, PROFILE_BUNDLE, PLAIN_BUNDLE]


def sniff_calls() -> AbstractContextManager[list[str]]:
    """Counts the calls of the one content sniffer while open."""
    return calls_of(_files.sniff, _files.sniff_head, _files.read_head)


def _blobs(items: list[TraceInput], tmp_path: Path) -> list[Path]:
    """Each file through its own stage, written to a blob."""
    blobs = []
    for i, item in enumerate(items):
        blob = tmp_path / f"part{i}.npz"
        size = dump_part(analyze_rank(item, files=len(items)), blob)
        assert size == blob.stat().st_size
        blobs.append(blob)
    return blobs


def _per_rank(items: list[TraceInput], tmp_path: Path, **kwargs: Any) -> str:
    """Each file through its own stage and blob, then the merge, the parts loaded one by one."""
    return merge_part_blobs(_blobs(items, tmp_path), **kwargs).report.model_dump_json()


@functools.cache
def _today(name: str) -> str:
    """The one-process analysis of a trace set from bare paths (as the CLI runs it)."""
    manifest = MANIFESTS[name]() if name in MANIFESTS else None
    return analyze(TRACE_SETS[name], manifest=manifest).model_dump_json()


@pytest.mark.parametrize("name", sorted(TRACE_SETS))
def test_typed_inputs_give_the_report_of_bare_paths_without_sniffing(name: str) -> None:
    manifest = MANIFESTS[name]() if name in MANIFESTS else None
    typed = [trace_input(p) for p in TRACE_SETS[name]]
    with sniff_calls() as seen:
        again = analyze(typed, manifest=manifest).model_dump_json()
    assert seen == []
    assert again == _today(name)


def test_the_sniff_observable_sees_bare_paths_sniffed() -> None:
    """The counter above can fail: bare paths are sniffed (once per file, to type them)."""
    paths = TRACE_SETS["synthetic-kineto-pair"]
    with sniff_calls() as seen:
        analyze(paths)
    assert seen.count("sniff") == len(paths)


def test_a_typed_format_is_trusted_not_sniffed() -> None:
    """The readers take the format they are given: a Kineto file typed nsys goes to the nsys
    reader (which says it is no SQLite export) instead of being sniffed and read as Kineto."""
    path = SYNTHETIC / "kineto_rank0.json.gz"
    wrong = TraceInput(path=path, format="nsys", gzipped=True)
    with pytest.raises((CorruptTraceError, UnsupportedTraceError)):
        analyze([wrong])
    analyze([trace_input(path)])


@pytest.mark.parametrize("name", sorted(TRACE_SETS))
def test_per_rank_parts_merge_into_the_same_report(name: str, tmp_path: Path) -> None:
    manifest = MANIFESTS[name]() if name in MANIFESTS else None
    typed = [trace_input(p) for p in TRACE_SETS[name]]
    assert _per_rank(typed, tmp_path, manifest=manifest) == _today(name)


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_bundles_typed_and_per_rank_give_the_same_report(bundle: Path, tmp_path: Path) -> None:
    today = analyze(bundle).model_dump_json()
    with read_bundle(bundle) as opened:
        items = [t.as_input(label=f"{bundle.name}:{t.member}") for t in opened.analysis_traces()]
        assert len(json.loads(today)["ranks"]) == (2 if bundle == BUNDLE else 1)
        assert _per_rank(items, tmp_path, manifest=opened.manifest) == today
        for trace in opened.traces:  # the kind the bundle reader found, not sniffed again
            with sniff_calls() as seen:
                check_trace(trace.path, kind=trace.kind, gzipped=trace.gzipped)
            assert seen == []


def test_multi_rank_sets_are_really_several_ranks() -> None:
    """The byte-identity above is about multi-rank runs: each of these has two ranks."""
    for name in MULTI_RANK:
        assert json.loads(_today(name))["ranks"] == [0, 1], name


def test_several_rankless_files_are_refused_by_the_merge(tmp_path: Path) -> None:
    """A rank rule that needs every file (several files, one without a rank) holds per rank."""
    files = []
    for i in range(2):
        raw = json.loads(gzip.decompress((SYNTHETIC / f"kineto_rank{i}.json.gz").read_bytes()))
        raw.pop("distributedInfo", None)
        target = tmp_path / f"profile_{'ab'[i]}.json"
        target.write_text(json.dumps(raw))
        files.append(trace_input(target))
    with pytest.raises(UnsupportedTraceError, match="cannot tell the rank of 2 of 2"):
        analyze(files)
    parts = [analyze_rank(item, files=2) for item in files]
    assert all(p.attribution is None for p in parts)
    with pytest.raises(UnsupportedTraceError, match="cannot tell the rank of 2 of 2"):
        merge_parts(parts)


def test_a_damaged_part_blob_is_a_clear_error(tmp_path: Path) -> None:
    blob = tmp_path / "part.npz"
    blob.write_bytes(b"not a part")
    with pytest.raises(CorruptTraceError, match="not a per-rank part"):
        load_part(blob)
    other = tmp_path / "other.npz"
    np.savez(other, meta=np.frombuffer(json.dumps({"version": 0}).encode(), dtype=np.uint8))
    with pytest.raises(CorruptTraceError, match="another version"):
        load_part(other)
    half = tmp_path / "half.npz"
    np.savez(
        half, meta=np.frombuffer(json.dumps({"version": PART_VERSION}).encode(), dtype=np.uint8)
    )
    with pytest.raises(CorruptTraceError, match="damaged per-rank part"):
        load_part(half)


def test_parts_merged_as_a_list_give_the_report_of_parts_streamed(tmp_path: Path) -> None:
    """``merge_parts`` without headers (parts held in memory) is the same merge."""
    name = "te-kineto-3arms"
    blobs = _blobs([trace_input(p) for p in TRACE_SETS[name]], tmp_path)
    merged = merge_parts([load_part(b) for b in blobs], manifest=MANIFESTS[name]())
    assert merged.report.model_dump_json() == _today(name)


def _copies(tmp_path: Path, ranks: int) -> list[Path]:
    """The synthetic pair's events under ranks 0..ranks-1 (world size ``ranks``)."""
    sources = [
        json.loads(gzip.decompress(p.read_bytes())) for p in TRACE_SETS["synthetic-kineto-pair"]
    ]
    out = []
    for rank in range(ranks):
        doc = {**sources[rank % 2], "distributedInfo": {"rank": rank, "world_size": ranks}}
        path = tmp_path / f"kineto_rank{rank}.json"
        path.write_text(json.dumps(doc))
        out.append(path)
    return out


def test_five_parts_merge_into_the_report_of_five_files(tmp_path: Path) -> None:
    """More parts than two: each part's keys, symbols and row references rebased in turn."""
    paths = _copies(tmp_path, 5)
    today = analyze(paths).model_dump_json()
    assert json.loads(today)["ranks"] == [0, 1, 2, 3, 4]
    assert _per_rank([trace_input(p) for p in paths], tmp_path) == today


def test_the_merge_lets_each_part_go_before_the_next_is_loaded(tmp_path: Path) -> None:
    """Memory of the merge: one part at a time besides the merged tables, not every part."""
    blobs = _blobs([trace_input(p) for p in _copies(tmp_path, 3)], tmp_path)
    alive: list[int] = []
    tables: list[weakref.ref[np.ndarray[Any, Any]]] = []

    def parts() -> Iterator[RankPart]:
        for blob in blobs:
            alive.append(sum(ref() is not None for ref in tables))
            part = load_part(blob)
            tables.extend([weakref.ref(part.trace.activities), weakref.ref(part.trace.ranges)])
            yield part
            del part

    merged = merge_parts(parts(), headers=[read_part_header(b) for b in blobs])
    assert merged.report.ranks == [0, 1, 2]
    assert alive == [0, 0, 0]


def test_a_part_whose_header_disagrees_with_its_tables_is_a_clear_error(tmp_path: Path) -> None:
    (blob,) = _blobs([trace_input(TRACE_SETS["synthetic-kineto-pair"][0])], tmp_path)
    with np.load(blob) as opened:
        arrays = {name: opened[name] for name in opened.files}
    meta = json.loads(arrays["meta"].tobytes())
    assert read_part_header(blob).rows == tuple(meta["rows"])
    meta["rows"][0] += 1
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(blob, **arrays)
    with pytest.raises(CorruptTraceError, match=r"damaged per-rank part.*header says"):
        load_part(blob)


def _shared_sets() -> list[tuple[str, list[Path]]]:
    """The shared folder's runs: each folder's Kineto files as one run, each nsys export."""
    shared = shared_traces_dir()
    if shared is None:
        return []
    out = []
    for folder in sorted(p for p in shared.rglob("*") if p.is_dir()):
        kineto = sorted(folder.glob("*rank*.json.gz"))
        if kineto:
            out.append((f"{folder.name}-kineto", kineto))
        out += [(f"{folder.name}-{p.name}", [p]) for p in sorted(folder.glob("*.sqlite*"))]
    return out


def _digest(paths: list[Path]) -> str:
    return hashlib.sha256(
        b"".join(hashlib.sha256(p.read_bytes()).digest() for p in paths)
    ).hexdigest()


@pytest.mark.parametrize(("name", "paths"), _shared_sets(), ids=[n for n, _ in _shared_sets()])
def test_shared_runs_per_rank_give_the_report_of_one_process(
    name: str, paths: list[Path], tmp_path: Path
) -> None:
    """``$CPTRACE_SHARED_TRACES``: a run already in tests/data (same bytes) is covered there."""
    known = {_digest(files): known for known, files in TRACE_SETS.items()}
    if _digest(paths) in known:
        pytest.skip(f"{name}: the bytes of tests/data's {known[_digest(paths)]}, compared above")
    today = analyze(paths).model_dump_json()
    assert _per_rank([trace_input(p) for p in paths], tmp_path) == today
