"""The demo bundles: valid, faithful to their sources, reproducible, within budget, and every
trace kept once (``demo/traces``; ``tests/data`` links to it; the bundles that wrap those traces
are built, never stored)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from testkit import DATA_DIR, demo_bundles_dir

from analyzers.bundle import read_bundle
from runners.demo_bundles import TRACE_BUNDLES

REPO = Path(__file__).resolve().parents[2]
STORED = REPO / "demo" / "bundles"
TRACES = REPO / "demo" / "traces"
BUNDLES = demo_bundles_dir()
FROM_TRACES = list(TRACE_BUNDLES)
GPU_CAPTURED = ["bundled-fixed-vs-broken-h200x2", "allgather-bundled-dcs-vs-nlb-h200x2"]
CU = [0, 8192, 12288, 14336, 16384]


def test_demo_data_stays_within_budget() -> None:
    stored = [*STORED.glob("*.tar.gz"), *(p for p in TRACES.rglob("*") if p.is_file())]
    assert sum(p.stat().st_size for p in stored) <= 20 * 1024 * 1024
    assert {p.name.removesuffix(".tar.gz") for p in BUNDLES.glob("*.tar.gz")} >= {
        *FROM_TRACES, *GPU_CAPTURED
    }
    assert not {p.name.removesuffix(".tar.gz") for p in STORED.glob("*.tar.gz")} & set(FROM_TRACES)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_every_trace_is_stored_once() -> None:
    """No stored bundle holds a copy of a trace file, and the test data links to demo/traces."""
    files = [p for p in DATA_DIR.rglob("*") if p.is_file() and not p.is_symlink()]
    files += [p for p in TRACES.rglob("*") if p.is_file()]
    by_digest = {_digest(p.read_bytes()): p for p in files}
    assert len(by_digest) == len(files), "two stored copies of one file"
    for archive in sorted(STORED.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    assert _digest(data) not in by_digest, (archive.name, member.name)
    linked = [p for p in DATA_DIR.rglob("*") if p.is_symlink()]
    assert {p.resolve() for p in linked} == {p.resolve() for p in TRACES.rglob("*") if p.is_file()}


@pytest.mark.parametrize("fmt,prefix", [("kineto", "arm:"), ("nsys", "nsys_arm:")])
def test_te_bundles_carry_the_readme_facts(fmt: str, prefix: str) -> None:
    with read_bundle(BUNDLES / f"te-2.20.2-{fmt}-3arms.tar.gz") as bundle:
        manifest = bundle.manifest
        assert manifest.workload.implementation == "te"
        assert manifest.workload.seqlens == [8192, 4096, 2048, 2048]
        arms = {v.name: v for v in manifest.variants}
        assert list(arms) == ["auto_clone", "explicit_false", "auto_same"]
        assert {v.window for v in arms.values()} == {f"{prefix}{n}" for n in arms}
        for v in arms.values():
            assert v.facts.cu_seqlens == v.facts.cu_seqlens_padded == CU
            assert v.iteration_ms == {}, "no per-iteration timings exist for these captures"
        assert (arms["auto_clone"].facts.padded_is_same_object,
                arms["auto_clone"].facts.pad_between_seqs) == (False, None)
        assert arms["explicit_false"].facts.pad_between_seqs is False
        assert arms["auto_same"].facts.padded_is_same_object is True
        assert manifest.model_extra is not None
        assert manifest.model_extra["reported_median_ms"] == {"auto_clone": 21.28,
                                                              "explicit_false": 18.59}
        ranks = sorted(t.rank for t in bundle.traces if t.rank is not None)
        assert ranks == ([0, 1] if fmt == "kineto" else [])


@pytest.mark.parametrize("name", GPU_CAPTURED)
def test_gpu_captured_bundles_have_timings_and_environment(name: str) -> None:
    with read_bundle(BUNDLES / f"{name}.tar.gz") as bundle:
        env = bundle.manifest.environment
        assert env["gpu_count"] == 2 and env["gpu_models"] == ["NVIDIA H200"]
        for variant in bundle.manifest.variants:
            assert sorted(variant.iteration_ms) == [0, 1]
            assert all(len(v) == 50 for v in variant.iteration_ms.values())


def test_make_bundles_reproduces_the_trace_bundles(tmp_path: Path) -> None:
    """Byte-reproducible: a second build (the script) equals the first (seeding finds them)."""
    subprocess.run(
        [sys.executable, str(REPO / "demo" / "make_bundles.py"), "--out", str(tmp_path)],
        check=True, cwd=REPO, capture_output=True,
    )
    for name in FROM_TRACES:
        rebuilt = (tmp_path / f"{name}.tar.gz").read_bytes()
        assert rebuilt == (BUNDLES / f"{name}.tar.gz").read_bytes(), name
