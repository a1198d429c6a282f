"""The composite action's script against the real service (``cptrace serve`` on loopback),
with the suites configured in the service (no GitHub needed): submit, wait, exit codes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from loop_repo import SMOKE_SPEC
from service_server import Server

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".github" / "actions" / "cptrace" / "submit_and_wait.py"
SHA = "ab" * 20


@pytest.fixture()
def server(tmp_path: Path):
    repos = tmp_path / "repos.yml"
    repos.write_text(yaml.safe_dump({"octo/model": {
        "clone_url": "https://git.example/octo/model.git",
        "suites": {"suites": {"smoke": {"gpus": 0, "specs": [SMOKE_SPEC]}}},
    }}))  # fmt: skip
    (tmp_path / "data").mkdir()
    env = {"CPTRACE_GITHUB_REPOS_FILE": str(repos), "GITHUB_TOKEN": ""}
    srv = Server(tmp_path / "data", worker=False, env=env).start()
    yield srv
    srv.stop()


def _run(server: Server, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--server", server.url, "--token", server.admin_token or "",
         "--repo", "octo/model", "--sha", SHA, "--pr", "3", "--base-ref", "main",
         "--poll-s", "0.2", *extra],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_action_submits_waits_and_fails_on_a_regression(server: Server) -> None:
    waiting = _run(server, "--timeout-s", "1")
    assert waiting.returncode == 2, waiting.stdout + waiting.stderr
    assert "1 suite(s) queued: smoke" in waiting.stdout and "timed out" in waiting.stdout
    db = sqlite3.connect(server.data_dir / "cptrace.db")
    (job,) = db.execute("SELECT repo, pr_number, head_sha, suite, checkout_json FROM jobs")
    assert job[:4] == ("octo/model", 3, SHA, "smoke")
    assert '"clone_url": "https://git.example/octo/model.git"' in job[4]
    with db:  # what the publisher writes once the batch's runs are judged
        db.execute("UPDATE pr_batches SET status = 'published', state = 'failure',"
                   " comment_url = 'https://github.test/c/1'")  # fmt: skip
    db.close()
    failed = _run(server, "--timeout-s", "30", "--fail-on-regression")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "smoke: failure https://github.test/c/1" in failed.stdout
    assert _run(server, "--timeout-s", "30").returncode == 0  # reported, not gating
    refused = _run(server, "--timeout-s", "1", "--token", "wrong")
    assert refused.returncode == 2 and "refused" in refused.stdout
    # Re-submitting the same commit queued nothing new.
    db = sqlite3.connect(server.data_dir / "cptrace.db")
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1
    db.close()
