"""Issue 7 on CPU: the 4-rank bundled matrix spec, shrunk to CPU sizes, on 4 gloo processes.

The GPU runs of issue 7 need a 4-GPU machine; this runs the same spec file
(``runners/examples/cp4_bundled_matrix.yaml``: P2P and all-gather, DualChunkSwap and NoLoadBalance,
fixed vs broken switches) with only the device and the sizes changed, so the launch path, the
4-rank bundle and its analysis are exercised end to end before a 4-GPU host is lent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from analyzers.bundle import read_bundle
from cptrace.cli import app

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CPU_SIZES = {
    "device": "cpu",
    "dtype": "fp32",
    "seqlens": [32, 16, 8, 8],  # divisible by 2 * 4 ranks
    "heads": 2,
    "head_dim": 8,
    "layers": 1,
    "warmup": 1,
    "iterations": 2,
    "profilers": {"mode": "torch", "profiled_steps": 1},
}


@pytest.fixture(scope="module")
def cp4_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = yaml.safe_load((ROOT / "runners/examples/cp4_bundled_matrix.yaml").read_text())
    assert spec["ranks"] == 4
    spec.update(CPU_SIZES)
    root = tmp_path_factory.mktemp("cp4")
    spec_path = root / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = root / "bundle"
    result = CliRunner().invoke(
        app, ["run", str(spec_path), "--nproc", "4", "--out", str(out), "--timeout", "400"]
    )
    assert result.exit_code == 0, result.output
    return out


def test_four_rank_bundle_has_every_variant_and_rank(cp4_bundle: Path) -> None:
    with read_bundle(cp4_bundle) as bundle:
        assert sorted(t.rank for t in bundle.traces) == [0, 1, 2, 3]
        variants = {v.name: v for v in bundle.manifest.variants}
        assert set(variants) == {f"{comm}_{strategy}_{kind}" for comm, strategy in
                                 (("p2p", "dcs"), ("ag", "dcs"), ("ag", "nlb"))
                                 for kind in ("fixed", "broken")}
        for variant in variants.values():
            assert sorted(variant.iteration_ms) == [0, 1, 2, 3]
            assert all(len(v) == 2 for v in variant.iteration_ms.values())


def test_four_rank_analysis_groups_every_arm(cp4_bundle: Path) -> None:
    from analyzers.pipeline import analyze

    report = analyze(cp4_bundle)
    assert set(report.ranks) == {0, 1, 2, 3}
    arms = {f"arm:{comm}_{strategy}_{kind}" for comm, strategy in
            (("p2p", "dcs"), ("ag", "dcs"), ("ag", "nlb")) for kind in ("fixed", "broken")}
    assert arms <= set(report.groups)
    ranks_per_arm = {(s.label, s.rank) for s in report.iterations if s.rank is not None}
    assert {(arm, rank) for arm in arms for rank in range(4)} <= ranks_per_arm
