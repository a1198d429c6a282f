"""``cptrace profile`` on real jobs (CPU, gloo): torch profiler, probe, and the hang scenario.

The jobs are small scripts in ``tests/runners/scripts`` that know nothing of cptrace. Each run
is bounded (``--timeout`` on the profile, the watchdog for the failing job).
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from analyzers import analyze
from analyzers.bundle import read_bundle
from cptrace.cli import app

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
SECRET = "cptrace-profile-secret-0123456789"


def _profile(out: Path, options: list[str], cmd: list[str]) -> Any:
    return CliRunner().invoke(
        app, ["profile", "--no-nsys", "--out", str(out), "--timeout", "240", *options, "--", *cmd],
        env={"CPTRACE_TOKEN": SECRET},
    )


def _manifest(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "manifest.json").read_text())


def test_profile_torch_single_process(tmp_path: Path) -> None:
    out = tmp_path / "single"
    result = _profile(out, ["--torch", "--probe"],
                      [sys.executable, str(SCRIPTS / "train_cp.py"), "--token", SECRET])
    assert result.exit_code == 0, result.output
    manifest = _manifest(out)
    with read_bundle(out) as bundle:
        assert [(t.format, t.rank) for t in bundle.traces] == [("kineto", 0)]
    assert manifest["run"]["exit_status"] == 0
    assert SECRET not in (out / "manifest.json").read_text()  # argv redacted, env never read
    assert manifest["run"]["spec"]["command"][-1] == "***"
    assert manifest["environment"]["torch"] and manifest["environment"]["world_size"] == 1
    observed = manifest["variants"][0]["facts"]["observed"]
    assert observed["function"] == "cp_attention.cp_attn"
    assert observed["calls"] == 6 and observed["sampled_calls"] == 6
    assert observed["value_equal_calls"] == 6
    report = analyze(out)
    assert report.iterations and report.iterations[0].n == 3  # --torch-active 3 steps


def test_profile_torchrun_two_ranks_probe_facts_in_findings(tmp_path: Path) -> None:
    out = tmp_path / "two"
    # 13 is not divisible by 2*cp=4: the job pads it, and the divisibility rule must say so
    # from what the probe saw inside both ranks.
    result = _profile(
        out, ["--torch", "--probe", "--probe-first", "4", "--probe-every", "2"],
        [*TORCHRUN, "--nproc-per-node", "2", str(SCRIPTS / "train_cp.py"), "--seqlens",
         "13,8,8", "--steps", "8"],
    )
    assert result.exit_code == 0, result.output
    manifest = _manifest(out)
    with read_bundle(out) as bundle:
        assert sorted((t.format, t.rank) for t in bundle.traces) == [("kineto", 0), ("kineto", 1)]
    assert sorted(manifest["probe"]) == ["0", "1"]
    facts = manifest["variants"][0]["facts"]
    assert facts["cu_seqlens"] == [0, 13, 21, 29] and facts["cu_seqlens_padded"] == [0, 16, 24, 32]
    observed = facts["observed"]
    assert observed["ranks"] == [0, 1]
    assert observed["calls"] == 8 and observed["sampled_calls"] == 6  # 1-4, then 6 and 8
    assert observed["value_equal_calls"] == 0 and observed["seqlens_divisible_2cp_calls"] == 0
    assert manifest["workload"]["cp_size"] == 2 and manifest["workload"]["strategy"] == (
        "dual_chunk_swap"
    )
    assert manifest["environment"]["world_size"] == 2
    report = analyze(out)
    assert report.ranks == [0, 1]
    finding = next(f for f in report.findings if f.rule == "seqlen-not-divisible")
    cited = {e.name: e.value for e in finding.evidence}
    key = "observed in the job by cptrace.probe (cp_attention.cp_attn on ranks [0, 1])"
    assert "multiple of 8 in 6 of 6" in str(cited[key])
    assert finding.recommendation.startswith("Observed in the job:")
    assert "object identity" in str(cited["not observed"])


def test_rank_failing_before_a_collective_is_diagnosed_not_hung(tmp_path: Path) -> None:
    out = tmp_path / "hang"
    started = time.monotonic()
    result = _profile(
        out, ["--torch", "--watchdog", "3"],
        [*TORCHRUN, "--nproc-per-node", "2", str(SCRIPTS / "raise_before_collective.py")],
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert elapsed < 120  # without the watchdog rank 0 waits in all_reduce for 30 minutes
    failure = _manifest(out)["failure"]
    assert failure["failed_rank"] == 1 and failure["stopped_by_watchdog"] is True
    assert failure["exception"]["type"] == "ValueError"
    assert "not a multiple of 8" in failure["exception"]["message"]
    assert failure["exception"]["where"]["function"] == "main"
    assert failure["ranks"]["0"]["state"] == "waiting"
    assert failure["ranks"]["0"]["collective"] == "all_reduce"
    assert "rank 1 raised ValueError" in failure["summary"] and "waiting in all_reduce" in (
        failure["summary"]
    )
    with read_bundle(out) as bundle:  # a valid bundle although nothing was captured
        assert bundle.traces == () and bundle.manifest.failure is not None
    assert "rank 1 raised ValueError" in " ".join(result.output.split())


def test_steps_on_a_user_function_and_nothing_captured_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "fn"
    result = _profile(
        out, ["--torch", "--step-function", "step_lib:train_step", "--torch-wait", "0",
              "--torch-warmup", "1", "--torch-active", "2"],
        [sys.executable, str(SCRIPTS / "fn_steps.py")],
    )
    assert result.exit_code == 0, result.output
    with read_bundle(out) as bundle:
        (trace,) = bundle.traces
    events = json.loads(gzip.decompress(trace.path.read_bytes()))["traceEvents"]
    steps = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
    assert len(steps) == 2 and any(e.get("name") == "my_step_body" for e in events)

    empty = tmp_path / "empty"
    result = _profile(empty, ["--torch"], [sys.executable, "-c", "import torch"])
    assert result.exit_code == 1
    assert "no trace was captured" in " ".join(result.output.split())
    assert not (empty / "manifest.json").exists() and (empty / "logs" / "profile.log").is_file()
