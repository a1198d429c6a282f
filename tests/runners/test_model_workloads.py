"""Model workloads (spec ``model:``) on 2 gloo ranks: FSDP token alignment, failure bundles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from analyzers import analyze
from analyzers.bundle import read_bundle
from cptrace.cli import app
from runners.spec import SpecError, parse_spec

SPEC: dict[str, Any] = {
    "name": "tt-fsdp",
    "device": "cpu",
    "ranks": 2,
    "model": {"kind": "torch_transformer", "fsdp": "fully_shard"},
    "seqlens": [12, 8, 6],
    "metadata": "real_padding",  # 6 -> 8 for DualChunkSwap: 28 packed tokens, 14 per rank
    "heads": 2,
    "head_dim": 8,
    "dtype": "fp32",
    "layers": 1,
    "warmup": 1,
    "iterations": 2,
    "watchdog_s": 10,
    "profilers": {"mode": "torch", "profiled_steps": 1},
}


def _run(tmp_path: Path, spec: dict[str, Any], name: str) -> Any:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**spec, "name": name}))
    out = tmp_path / name
    result = CliRunner().invoke(
        app, ["run", str(path), "--out", str(out), "--timeout", "240"]
    )
    return result, out


def test_model_spec_validation() -> None:
    with pytest.raises(SpecError, match=r"model\.fp8: needs kind te_transformer"):
        parse_spec({**SPEC, "model": {"kind": "torch_transformer", "fp8": True}})
    with pytest.raises(SpecError, match="overrides run-level field"):
        parse_spec({**SPEC, "variants": {"a": {"model": {"kind": "te_transformer"}}}})
    spec = parse_spec({**SPEC, "model": {"kind": "te_transformer", "fp8": True}})
    assert spec.model is not None and spec.model.fp8_recipe == "delayed"


@pytest.mark.slow
def test_fsdp_misaligned_tokens_get_the_exact_padding(tmp_path: Path) -> None:
    result, out = _run(tmp_path, SPEC, "misaligned")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["workload"]["model"]["fsdp"] == "fully_shard"
    assert manifest["variants"][0]["facts"]["fsdp"] is True
    finding = next(f for f in analyze(out).findings if f.rule == "token-alignment")
    assert "28 packed tokens (14 per rank)" in finding.title
    assert "Pad the packed batch to 32 tokens (4 padding tokens" in finding.recommendation


@pytest.mark.slow
def test_fsdp_aligned_tokens_run_clean(tmp_path: Path) -> None:
    # the same workload with the alignment it asks for: no token-alignment finding
    result, out = _run(tmp_path, {**SPEC, "token_alignment": 16}, "aligned")
    assert result.exit_code == 0, result.output
    assert not [f for f in analyze(out).findings if f.rule == "token-alignment"]


@pytest.mark.slow
def test_a_failing_launch_still_writes_a_bundle_with_the_failure(tmp_path: Path) -> None:
    # te_transformer needs CUDA: every rank raises while building its model, on this CPU host.
    result, out = _run(tmp_path, {**SPEC, "model": {"kind": "te_transformer"}}, "te-on-cpu")
    assert result.exit_code == 1
    assert "needs CUDA" in result.output and str(out) in " ".join(result.output.split())
    with read_bundle(out) as bundle:
        failure = bundle.manifest.failure
        assert failure is not None and failure.failed_rank in (0, 1)
        assert failure.exception is not None and failure.exception["type"] == "RuntimeError"
        assert "needs CUDA" in str(failure.exception["message"])
        assert bundle.traces == ()
