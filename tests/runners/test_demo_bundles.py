"""The shipped demo bundles: valid, faithful to their sources, reproducible, within budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analyzers.bundle import read_bundle

REPO = Path(__file__).resolve().parents[2]
BUNDLES = REPO / "demo" / "bundles"
FROM_TRACES = [
    "te-2.20.2-kineto-3arms", "te-2.20.2-nsys-3arms", "synthetic-h200x2-kineto",
    "synthetic-h200x2-nsys",
]
GPU_CAPTURED = ["bundled-fixed-vs-broken-h200x2", "allgather-bundled-dcs-vs-nlb-h200x2"]
CU = [0, 8192, 12288, 14336, 16384]


def test_demo_data_stays_within_budget() -> None:
    total = sum(p.stat().st_size for p in BUNDLES.glob("*.tar.gz"))
    assert total <= 20 * 1024 * 1024
    assert {p.name.removesuffix(".tar.gz") for p in BUNDLES.glob("*.tar.gz")} >= {
        *FROM_TRACES, *GPU_CAPTURED
    }


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
    subprocess.run(
        [sys.executable, str(REPO / "demo" / "make_bundles.py"), "--out", str(tmp_path)],
        check=True, cwd=REPO, capture_output=True,
    )
    for name in FROM_TRACES:
        rebuilt = (tmp_path / f"{name}.tar.gz").read_bytes()
        assert rebuilt == (BUNDLES / f"{name}.tar.gz").read_bytes(), name
