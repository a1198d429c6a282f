"""``cptrace profile`` on real jobs (CPU, gloo): torch profiler, probe, every step timed, a rank
that raises and a job that hangs (both with every rank's Python stack).

The jobs are small scripts in ``tests/runners/scripts`` that know nothing of cptrace. Each run
is bounded (``--timeout`` on the profile, the watchdog for the failing job, ``--hang-timeout``
for the hung one).
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


def _line_of(script: Path, marker: str) -> int:
    """The line of ``script`` that carries ``marker`` (so the test names lines, not numbers)."""
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if marker in line)


def _names_line(stack: str, script: Path, line: int) -> bool:
    return f'File "{script}", line {line} in ' in stack


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
    script = SCRIPTS / "raise_before_collective.py"
    assert failure["exception"]["where"]["file"] == str(script)
    assert failure["exception"]["where"]["line"] == _line_of(script, "raise ValueError(")
    assert failure["ranks"]["0"]["state"] == "waiting"
    assert failure["ranks"]["0"]["collective"] == "all_reduce"
    # The watchdog asked every rank for its stacks before it stopped the job: rank 0 names the
    # all_reduce it waited in; rank 1 (raised, kept alive by a thread) answered by file.
    assert _names_line(failure["stacks"]["0"], script, _line_of(script, "dist.all_reduce("))
    assert failure["ranks"]["0"]["waiting_at"]["line"] == _line_of(script, "dist.all_reduce(")
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
    # 5 calls are 5 steps: call 0 is warm-up, calls 1-3 ran under the profiler, call 4 is timed.
    assert _manifest(out)["step_times"]["ranks"]["0"]["steps"] == 5
    assert len(_manifest(out)["variants"][0]["iteration_ms"]["0"]) == 1

    empty = tmp_path / "empty"
    result = _profile(empty, ["--torch"], [sys.executable, "-c", "import torch"])
    assert result.exit_code == 1
    assert "no trace was captured" in " ".join(result.output.split())
    assert not (empty / "manifest.json").exists() and (empty / "logs" / "profile.log").is_file()


def test_hung_job_gets_every_ranks_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No rank raises: rank 1 sleeps, rank 0 waits in a barrier. The hang timeout finds rank 0
    waiting, the watchdog dumps both ranks' stacks, stops the job, and the bundle, the summary
    and the CLI output say where each rank was."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # torchrun's warning is the job output
    out = tmp_path / "hung"
    script = SCRIPTS / "hang_in_barrier.py"
    result = _profile(
        out, ["--torch", "--hang-timeout", "2"],
        [*TORCHRUN, "--nproc-per-node", "2", str(script)],
    )
    assert result.exit_code == 1, result.output
    failure = _manifest(out)["failure"]
    waiting, sleeping = _line_of(script, "WAITING-LINE"), _line_of(script, "SLEEPING-LINE")
    assert failure["hung"]["rank"] == 0 and failure["hung"]["collective"] == "barrier"
    assert failure["exception"] is None and failure["stopped_by_watchdog"] is False
    assert sorted(failure["stacks"]) == ["0", "1"]
    assert _names_line(failure["stacks"]["0"], script, waiting)
    assert _names_line(failure["stacks"]["1"], script, sleeping)
    assert failure["ranks"]["0"]["waiting_at"] == {
        "file": str(script), "line": waiting, "function": "wait_for_peers"}
    assert failure["ranks"]["1"]["waiting_at"]["function"] == "work_forever"
    assert f"{script}:{waiting} in wait_for_peers" in failure["summary"]
    assert f"{script}:{sleeping} in work_forever" in failure["summary"]
    assert any("the job is hung" in line for line in failure["log_tail"])
    with read_bundle(out) as bundle:  # the typed record the pages and the comment read
        assert bundle.manifest.failure is not None
        assert set(bundle.manifest.failure.stacks) == {"0", "1"}
    output = result.output
    assert "--- rank 0: Python stacks" in output and "--- rank 1: Python stacks" in output
    assert f'File "{script}", line {waiting} in wait_for_peers' in output
    # The job's own output reached the terminal as well as the log.
    assert "OMP_NUM_THREADS" in output and "OMP_NUM_THREADS" in (
        out / "logs" / "profile.log").read_text()


def test_every_step_is_timed_not_only_the_profiled_ones(tmp_path: Path) -> None:
    """30 optimizer steps = 29 step intervals; the first is warm-up and the profiler recorded 4
    (warm-up 1 + active 3): 24 timed iterations, not the 3 profiled ones."""
    out = tmp_path / "timed"
    result = _profile(out, ["--torch", "--quiet"],
                      [sys.executable, str(SCRIPTS / "train_cp.py"), "--steps", "30"])
    assert result.exit_code == 0, result.output
    manifest = _manifest(out)
    (variant,) = manifest["variants"]
    assert variant["window"] is None and len(variant["iteration_ms"]["0"]) == 24
    assert all(ms > 0 for ms in variant["iteration_ms"]["0"])
    assert manifest["step_times"]["ranks"]["0"] == {
        "steps": 29, "timed": 24, "warmup": 1, "profiled": 4, "clocks": {"perf_counter": 29}}
    assert "steps timed: rank 0: n=24" in result.output
    report = analyze(out)
    timed = [it for it in report.iterations if it.source == "timed"]
    assert [(it.label, it.rank, it.n) for it in timed] == [
        ("ProfilerStep", 0, 24), ("ProfilerStep", None, 24)]
    assert not any("no timed iterations" in note for note in report.notes)


def test_a_failed_jobs_record_holds_no_secret_of_its_command_line(tmp_path: Path) -> None:
    """The job prints its --token and raises with it: the failure record (log tail, exception)
    shows ***, as the recorded command line does; the log's command line is redacted too."""
    out = tmp_path / "leaky"
    job = ("import sys, torch; print('args:', sys.argv[1:], flush=True); "
           "raise ValueError('bad token ' + sys.argv[2])")
    result = _profile(out, ["--torch", "--watchdog", "1", "--quiet"],
                      [sys.executable, "-c", job, "--token", SECRET])
    assert result.exit_code == 1, result.output
    failure = _manifest(out)["failure"]
    assert failure["exception"]["message"] == "bad token ***"
    assert any("args: ['--token', '***']" in line for line in failure["log_tail"])
    assert SECRET not in (out / "manifest.json").read_text()
    log = (out / "logs" / "profile.log").read_text().splitlines()
    assert log[0].startswith("$ ") and SECRET not in log[0] and log[0].endswith("--token '***'")
