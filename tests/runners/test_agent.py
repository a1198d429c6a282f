"""The agent against the real service (claim, heartbeat, complete, fail, release on SIGTERM)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from runner_fixtures import FakeService, LiveService

from runners.agent import Agent, AgentConfig
from runners.http import ServiceClient
from runners.launch import LaunchError, LaunchOptions
from runners.spec import RunSpec

REPO = Path(__file__).resolve().parents[2]
SMOKE = {
    "name": "agent-smoke", "implementation": "bundled", "device": "cpu", "ranks": 2,
    "seqlens": [16, 8], "heads": 2, "head_dim": 8, "dtype": "fp32", "layers": 1,
    "warmup": 0, "iterations": 1, "profilers": {"mode": "none"},
}


def _api(service: LiveService, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        f"{service.url}/api/v1{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {service.tokens['admin']}",
                 "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _submit(service: LiveService, spec: dict[str, Any]) -> int:
    return int(_api(service, "POST", "/jobs", {"spec": spec, "gpus": 0})["id"])


def _config(tmp_path: Path, **kw: Any) -> AgentConfig:
    defaults: dict[str, Any] = dict(
        runner="test-runner", gpus=0, work_dir=tmp_path / "runs", wait_s=0.5, heartbeat_s=0.1,
        max_jobs=1, max_idle_polls=4,
    )
    return AgentConfig(**{**defaults, **kw})


def test_job_completes_with_the_uploaded_run(
    fresh_service: LiveService, synthetic_bundle: Path, tmp_path: Path
) -> None:
    job_id = _submit(fresh_service, SMOKE)
    seen: list[str] = []

    def fake_run(spec: RunSpec, out: Path, options: LaunchOptions) -> Path:
        seen.append(spec.name)
        time.sleep(0.5)  # long enough for several heartbeats
        shutil.copytree(synthetic_bundle, out)
        return out

    client = ServiceClient(fresh_service.url, fresh_service.tokens["runner"])
    agent = Agent(client, _config(tmp_path), run_fn=fake_run)
    assert agent.serve() == 1
    job = _api(fresh_service, "GET", f"/jobs/{job_id}")
    assert seen == ["agent-smoke"]
    assert job["status"] == "completed" and job["run_id"] >= 1 and job["runner"] == "test-runner"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_failed_launch_reports_reason_and_log_tail(
    fresh_service: LiveService, tmp_path: Path
) -> None:
    job_id = _submit(fresh_service, SMOKE)

    def failing_run(spec: RunSpec, out: Path, options: LaunchOptions) -> Path:
        raise LaunchError("torchrun exited with status 1", log_tail="RuntimeError: NCCL timeout\n")

    client = ServiceClient(fresh_service.url, fresh_service.tokens["runner"])
    Agent(client, _config(tmp_path), run_fn=failing_run).serve()
    job = _api(fresh_service, "GET", f"/jobs/{job_id}")
    assert job["status"] == "failed"
    assert job["reason"] == "torchrun exited with status 1"
    assert "NCCL timeout" in job["log_tail"]


def test_idle_agent_stops_after_empty_polls(fake_service: FakeService, tmp_path: Path) -> None:
    fake_service.handler = lambda path, headers, body: (204, None)
    agent = Agent(ServiceClient(fake_service.url, "t"), _config(tmp_path, max_idle_polls=2))
    assert agent.serve() == 0
    assert fake_service.paths() == ["/api/v1/jobs/claim"] * 2
    assert json.loads(fake_service.calls[0][2]) == {"runner": "test-runner", "gpus": 0,
                                                    "wait_s": 0.5}


def test_lost_lease_cancels_the_run_and_reports_nothing(
    fake_service: FakeService, tmp_path: Path
) -> None:
    def handler(path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        if path.endswith("/claim"):
            return 200, {"id": 5, "spec": SMOKE, "lease_expires_at": time.time() + 5}
        return 409, {"ok": False, "error": "job 5 is held by runner 'other'"}

    fake_service.handler = handler
    cancelled = threading.Event()

    def waiting_run(spec: RunSpec, out: Path, options: LaunchOptions) -> Path:
        assert options.cancel is not None
        if options.cancel.wait(10):
            cancelled.set()
            raise LaunchError("torchrun cancelled")
        raise AssertionError("the lost lease did not cancel the run")

    agent = Agent(ServiceClient(fake_service.url, "t"), _config(tmp_path), run_fn=waiting_run)
    assert agent.handle(agent.claim() or {}) == "lost"
    assert cancelled.is_set()
    assert [p for p in fake_service.paths() if not p.endswith(("/claim", "/heartbeat"))] == []


def _children_running(marker: str) -> list[int]:
    """PIDs whose command line mentions ``marker`` (our run's scratch directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_sigterm_releases_the_running_job(fresh_service: LiveService, tmp_path: Path) -> None:
    """A real ``cptrace agent`` process runs a real 2-rank CPU job; SIGTERM releases it."""
    endless = {**SMOKE, "name": "endless", "iterations": 10_000_000}
    job_id = _submit(fresh_service, endless)
    work = tmp_path / "agent-runs"
    env = {**os.environ, "CPTRACE_TOKEN": fresh_service.tokens["runner"]}
    agent = subprocess.Popen(
        [sys.executable, "-c", "from cptrace.cli import main; main()", "agent",
         "--server", fresh_service.url, "--gpus", "0", "--name", "term-runner",
         "--work-dir", str(work), "--wait", "1",
         "--heartbeat", "0.5", "--term-grace", "0", "--max-jobs", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(work.glob("*/logs/*.log")) or not _children_running(str(work)):
            assert agent.poll() is None, agent.stdout.read().decode() if agent.stdout else ""
            assert time.monotonic() < deadline, "the agent never started the launch"
            time.sleep(0.2)
        assert _api(fresh_service, "GET", f"/jobs/{job_id}")["status"] == "running"
        agent.send_signal(signal.SIGTERM)
        output, _ = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, output.decode()
    job = _api(fresh_service, "GET", f"/jobs/{job_id}")
    assert job["status"] == "queued" and "released" in job["reason"]
    assert job["attempts"] == 0, "a released job does not use up an attempt"
    time.sleep(0.5)
    assert _children_running(str(work)) == [], "the ranks must be stopped with the agent"


def test_failed_job_uploads_its_bundle_and_names_the_run(
    fresh_service: LiveService, tmp_path: Path
) -> None:
    """A job that raises still has a bundle (its failure record): the agent uploads it and the
    job's failure names that run, so the service can show who raised what where."""
    from runners.profile.run import ProfileOptions, profile_job

    job_id = _submit(fresh_service, SMOKE)

    def raising_run(spec: RunSpec, out: Path, options: LaunchOptions) -> Path:
        job = [sys.executable, "-c", "import torch\nraise ValueError('tokens not a multiple of 8')"]
        result = profile_job(job, out, ProfileOptions(torch=True, watchdog_s=1, timeout_s=60))
        assert result.failure is not None
        error = LaunchError(result.failure["summary"], log_tail=result.supervised.tail())
        error.bundle = result.bundle
        raise error

    client = ServiceClient(fresh_service.url, fresh_service.tokens["runner"])
    Agent(client, _config(tmp_path), run_fn=raising_run).serve()
    job = _api(fresh_service, "GET", f"/jobs/{job_id}")
    assert job["status"] == "failed" and "raised ValueError" in job["reason"]
    assert job["run_id"] is not None
    failure = _api(fresh_service, "GET", f"/runs/{job['run_id']}")["manifest"]["failure"]
    assert failure["failed_rank"] == 0 and failure["exception"]["type"] == "ValueError"
    assert failure["exception"]["where"] == {"file": "<string>", "line": 2, "function": "<module>"}
    assert any("ValueError: tokens not a multiple of 8" in line for line in failure["log_tail"])
