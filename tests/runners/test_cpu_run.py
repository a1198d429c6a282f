"""A real run: ``cptrace run`` on 2 gloo processes, bundled implementation, torch profiler.

The bundle it writes is then read the way the service reads it, and analyzed by the analyzers'
pipeline, which must find the bundled implementation's helpers inside each arm's window.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from analyzers.bundle import read_bundle
from cptrace.cli import app

pytestmark = pytest.mark.slow

SECRET = "cptrace-test-secret-0123456789"
SPEC = {
    "name": "cpu-test",
    "implementation": "bundled",
    "device": "cpu",
    "ranks": 2,
    "seqlens": [32, 16, 8, 8],
    "heads": 2,
    "kv_heads": 1,
    "head_dim": 8,
    "dtype": "fp32",
    "layers": 2,
    "warmup": 1,
    "iterations": 3,
    "profilers": {"mode": "torch", "profiled_steps": 2},
    "variants": {
        "fixed": {},
        "broken": {"broken_identity_padding": True, "broken_always_zero_fill": True},
    },
}


@pytest.fixture(scope="module")
def run_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run the spec once through the CLI, with a secret in the environment. On torchrun: a
    CPU spec forks its ranks by default (``runners/forkrun.py``, which the 4-rank CPU run and
    the loop's runs use); this keeps torchrun's own launch path run end to end."""
    root = tmp_path_factory.mktemp("cpu-run")
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    out = root / "bundle"
    result = CliRunner().invoke(
        app, ["run", str(spec), "--nproc", "2", "--out", str(out), "--pack", "--timeout", "240",
              "--launcher", "torchrun"],
        env={"CPTRACE_TOKEN": SECRET},
    )
    assert result.exit_code == 0, result.output
    return out


def _events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)["traceEvents"]


def test_manifest_records_variants_facts_and_timings(run_bundle: Path) -> None:
    with read_bundle(run_bundle) as bundle:
        manifest = bundle.manifest
        assert [(t.format, t.rank) for t in bundle.traces] == [("kineto", 0), ("kineto", 1)]
        assert manifest.workload.implementation == "bundled" and manifest.workload.cp_size == 2
        assert manifest.workload.kv_heads == 1
        fixed, broken = manifest.variants
        assert (fixed.name, fixed.window, broken.window) == ("fixed", "arm:fixed", "arm:broken")
        assert fixed.facts.cu_seqlens == fixed.facts.cu_seqlens_padded == [0, 32, 48, 56, 64]
        assert fixed.facts.padded_is_same_object is False  # value-equal clone (the default)
        assert fixed.facts.total_tokens == 64
        assert fixed.facts.zero_fill_grad_tails is False and broken.facts.zero_fill_grad_tails
        assert broken.workload == {"broken_identity_padding": True,
                                   "broken_always_zero_fill": True}
        for variant in (fixed, broken):
            assert sorted(variant.iteration_ms) == [0, 1]
            assert all(len(v) == 3 and min(v) > 0 for v in variant.iteration_ms.values())
        assert manifest.environment["torch"] and manifest.environment["gpu_count"] == 0
        assert bundle.run.spec is not None and bundle.run.spec["name"] == "cpu-test"
        assert bundle.run.host is None  # only with --hostname
    raw = json.loads((run_bundle / "manifest.json").read_text())
    assert raw["variant_facts"]["fixed"]["padded_equals_unpadded"] is True
    assert raw["variant_facts"]["fixed"]["same_object"] is False


def test_no_secret_or_environment_leaks_into_the_bundle(run_bundle: Path) -> None:
    archive = run_bundle.with_name(run_bundle.name + ".tar.gz")
    assert archive.is_file()
    for path in [*run_bundle.rglob("*"), archive]:
        if path.is_file():
            data = path.read_bytes()
            if path.name.endswith(".gz"):
                data = gzip.decompress(data)
            assert SECRET.encode() not in data, f"{path.name} carries an environment secret"


def test_kineto_traces_have_arm_windows_steps_and_helpers(run_bundle: Path) -> None:
    for rank in (0, 1):
        events = _events(run_bundle / "traces" / f"kineto_rank{rank}.json.gz")
        names = [e.get("name", "") for e in events if e.get("ph") == "X"]
        assert names.count("arm:fixed") == 2 and names.count("arm:broken") == 2
        assert sum(n.startswith("ProfilerStep#") for n in names) == 4
        for phase in ("metadata", "attn_fwd_step", "attn_bwd_step", "comm_send_recv"):
            assert f"cp_attention.{phase}" in names, phase
        assert any(e.get("cat") == "python_function" for e in events), "with_stack=True"


def _helper_calls_per_arm(bundle_dir: Path) -> dict[tuple[str, str], int]:
    """Catalogued helper ranges inside each arm window, read through the analyzers."""
    from analyzers.catalog import load_catalog
    from analyzers.readers import read_traces

    catalog = load_catalog(use_env=False)
    with read_bundle(bundle_dir) as bundle:
        trace = read_traces(bundle.analysis_paths())
    ranges = trace.ranges
    names = [trace.name_of(int(i)) for i in ranges["name"]]
    counts: dict[tuple[str, str], int] = {}
    for w, window in enumerate(names):
        if not window.startswith("arm:"):
            continue
        inside = (
            (ranges["rank"] == ranges["rank"][w])
            & (ranges["thread"] == ranges["thread"][w])
            & (ranges["start"] >= ranges["start"][w])
            & (ranges["end"] <= ranges["end"][w])
        )
        for j in inside.nonzero()[0]:
            index, _ = catalog.match_range(names[j])
            if index >= 0:
                key = (window, catalog.helpers[index].name)
                counts[key] = counts.get(key, 0) + 1
    return counts


def test_analyzers_find_the_bundled_helpers_per_arm(run_bundle: Path) -> None:
    from analyzers.pipeline import analyze

    report = analyze(run_bundle)
    assert set(report.ranks) == {0, 1}
    assert {"arm:fixed", "arm:broken"} <= set(report.groups)
    # The manifest's per-rank timings reach the report under the arm windows' names.
    assert {(s.label, s.rank, s.n) for s in report.iterations} >= {
        ("arm:fixed", 0, 3), ("arm:fixed", 1, 3), ("arm:broken", 0, 3), ("arm:broken", 1, 3)
    }
    calls = _helper_calls_per_arm(run_bundle)
    for window in ("arm:fixed", "arm:broken"):
        for helper in ("cp_attention.metadata", "cp_attention.attn_fwd_step",
                       "cp_attention.attn_bwd_step", "cp_attention.comm_send_recv"):
            assert calls.get((window, helper), 0) > 0, (window, helper)
    # The broken switch zero-fills gradients that have no padding; the fixed arm never does.
    assert calls.get(("arm:broken", "cp_attention.grad_zero_fill"), 0) > 0
    assert calls.get(("arm:fixed", "cp_attention.grad_zero_fill"), 0) == 0
