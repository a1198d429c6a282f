"""``cptrace analyze`` on the bundle of a job that failed before writing any trace.

The bundle is real: ``cptrace profile`` runs a two-rank gloo job in which rank 1 raises before
a collective (the TE #1795 shape); the failure watchdog stops it and the bundle holds a manifest
with a ``failure`` block and no traces. A second bundle, written by the runners' own bundle
writer with that failure record and the workload facts of an FP8 run, shows the diagnosis the
manifest supports without a trace.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from analyzers.bundle import read_bundle
from cptrace.cli import app
from runners import bundle as bundle_writer

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[1] / "runners" / "scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


@pytest.fixture(scope="module")
def failed_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("failed") / "bundle"
    result = CliRunner().invoke(
        app,
        ["profile", "--no-nsys", "--out", str(out), "--timeout", "240", "--torch",
         "--watchdog", "3", "--", *TORCHRUN, "--nproc-per-node", "2",
         str(SCRIPTS / "raise_before_collective.py")],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    with read_bundle(out) as bundle:
        assert bundle.traces == () and bundle.manifest is not None
        assert bundle.manifest.failure is not None
    return out


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


def test_failed_bundle_says_in_one_line_that_the_job_failed(failed_bundle: Path) -> None:
    result = CliRunner().invoke(app, ["analyze", str(failed_bundle)])
    assert result.exit_code == 1
    (line,) = _error_lines(result.output)
    assert "no trace files given" not in result.output
    assert f"{failed_bundle}: no traces: the job failed before writing any" in line
    assert "rank 1 raised ValueError" in line and "not a multiple of 8" in line
    assert "Traceback" not in result.output


def _with_facts(failed: Path, out: Path) -> Path:
    """The failed run's record in a bundle whose manifest also has an FP8 run's facts."""
    failure: dict[str, Any] = json.loads((failed / "manifest.json").read_text())["failure"]
    out.mkdir()
    bundle_writer.finalize_bundle(
        out,
        run=bundle_writer.run_info(name="fp8-failed", spec={}),
        traces=[],
        workload={"cp_size": 2},
        variants=[{"name": "run", "facts": {"fp8": True, "total_tokens": 8190}}],
        environment={},
        extra={"failure": failure},
    )
    return out


def test_failed_bundle_still_prints_what_the_manifest_shows(
    failed_bundle: Path, tmp_path: Path
) -> None:
    path = _with_facts(failed_bundle, tmp_path / "fp8")
    result = CliRunner().invoke(app, ["analyze", str(path)])
    assert result.exit_code == 1
    (line,) = _error_lines(result.output)
    assert "the job failed before writing any" in line and "rank 1 raised ValueError" in line
    text = " ".join(result.output.split())
    assert "Findings from the run manifest (no trace)" in text
    assert "[token-alignment] 8190 packed tokens (4095 per rank) are not a multiple of 8" in text
    assert "the run failed" in text  # the finding cites the failure record
    as_json = CliRunner().invoke(app, ["analyze", str(path), "--json"])
    assert as_json.exit_code == 1
    payload = json.loads(as_json.stdout)
    assert list(payload) == ["failure_headline", "failure", "findings"]  # the failure leads
    assert payload["failure_headline"].startswith("rank 1 raised ValueError: packed token count")
    assert payload["failure"]["failed_rank"] == 1
    assert [f["rule"] for f in payload["findings"]] == ["token-alignment"]
