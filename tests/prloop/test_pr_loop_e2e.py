"""The whole loop on CPU with real processes on loopback, no person in between.

fake GitHub (signed webhooks, contents and compare over a real bare git repository, comments,
statuses) -> ``cptrace serve`` (uvicorn + the analysis worker, which publishes) -> a real
``cptrace agent`` that checks out each commit, runs its setup command and the CPU smoke spec
on gloo, uploads the bundle -> the comment, created on the pull request's first push (whose
setup fails) and updated on the second (whose spec turns on the bundled attention's broken
switches: extra padding and zero-fill work), plus the commit statuses.

On CPU the analysis attributes no GPU launches (there are none), so there are no per-helper
launch rows; the slow commit fails the suite's policy through the findings that appeared (the
broken switches' helpers, cp_attention.grad_zero_fill and the per-step metadata recompute, start
running: deterministic), and through its iteration time when that beats the shared machine's
noise. The per-helper and per-kernel launch deltas of the comment are checked on real H200
traces in test_pr_loop_units.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_github import FakeGitHubServer, send_webhook
from loop_repo import SMOKE_SPEC, LoopRepo
from service_server import Server

REPO = "octo/model"
SECRET = "webhook-secret-for-tests"
PUBLIC = "https://cptrace.test"


def push_payload(branch: str, after: str, clone_url: str) -> dict[str, Any]:
    return {
        "ref": f"refs/heads/{branch}",
        "after": after,
        "deleted": False,
        "repository": {"full_name": REPO, "clone_url": clone_url},
        "sender": {"login": "dev"},
    }


def pr_payload(
    action: str, number: int, head: str, base: str, clone_url: str, *, fork: bool = False
) -> dict[str, Any]:
    return {
        "action": action,
        "number": number,
        "pull_request": {
            "number": number,
            "head": {
                "sha": head,
                "ref": "feature",
                "repo": {"full_name": "mallory/model" if fork else REPO},
            },
            "base": {"sha": base, "ref": "main", "repo": {"full_name": REPO}},
        },
        "repository": {"full_name": REPO, "clone_url": clone_url},
        "sender": {"login": "dev"},
    }


def wait_for(what: str, check: Callable[[], Any], timeout: float, proc: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.slow
def test_pull_request_loop_end_to_end(tmp_path: Path) -> None:
    started = time.monotonic()
    repo = LoopRepo(tmp_path / "git")
    base = repo.commit("baseline workload", spec=SMOKE_SPEC)
    repo.push("main")
    repo.git("checkout", "-qb", "feature")
    broken_setup = repo.commit(
        "setup that cannot work",
        spec=SMOKE_SPEC,
        setup="echo installing the package; echo 'error: no such package: cp-attn' >&2; exit 3",
    )
    slow_spec = {**SMOKE_SPEC, "broken_identity_padding": True, "broken_always_zero_fill": True}
    slow = repo.commit("pad and zero-fill everything", spec=slow_spec, setup="echo setup ok")
    repo.push("feature")

    with FakeGitHubServer() as github:
        github.git_dirs[REPO] = repo.bare
        env = {
            "GITHUB_TOKEN": github.token,
            "GITHUB_API_URL": github.url,
            "CPTRACE_GITHUB_WEBHOOK_SECRET": SECRET,
            "CPTRACE_GITHUB_PUBLIC_URL": PUBLIC,
            "CPTRACE_GITHUB_PUBLISH_INTERVAL_S": "0.2",
            "CPTRACE_WORKER_POLL_S": "0.2",
        }
        (tmp_path / "data").mkdir()
        server = Server(tmp_path / "data", env=env).start()
        agent = None
        try:
            hook = f"{server.url}/api/v1/github/webhook"

            def job_count() -> int:
                got = httpx.get(f"{server.url}/api/v1/jobs", headers=server.headers, timeout=10)
                return len(got.json())

            # A forged delivery is refused before anything is read or queued.
            forged = send_webhook(
                hook, SECRET, "push", push_payload("main", base, repo.clone_url),
                signature="sha256=" + "0" * 64,
            )  # fmt: skip
            assert forged.status_code == 401 and job_count() == 0
            unknown = send_webhook(hook, SECRET, "star", {"action": "created"})
            assert unknown.status_code == 202 and "not handled" in unknown.json()["outcome"]

            opened = send_webhook(
                hook, SECRET, "pull_request",
                pr_payload("opened", 7, broken_setup, base, repo.clone_url), delivery="d-open",
            )  # fmt: skip
            assert opened.status_code == 202 and opened.json()["batches"], opened.text
            assert job_count() == 1

            agent_log = (tmp_path / "agent.log").open("w")
            agent = subprocess.Popen(
                [
                    sys.executable, "-c", "from cptrace.cli import main; main()", "agent",
                    "--server", server.url, "--token", server.admin_token or "", "--gpus", "0",
                    "--max-jobs", "3", "--max-idle-polls", "120", "--wait", "1",
                    "--heartbeat", "2", "--work-dir", str(tmp_path / "agent"),
                ],
                stdout=agent_log, stderr=subprocess.STDOUT,
                env={**os.environ, "CPTRACE_TOKEN": ""}, start_new_session=True,
            )  # fmt: skip

            # First push of the PR: its setup fails -> the comment says so, status error.
            first = wait_for(
                "the comment on the first push",
                lambda: github.bodies(REPO, 7),
                120,
            )
            assert len(first) == 1
            assert "setup command failed" in first[0] and "exited with status 3" in first[0]
            assert "no such package: cp-attn" in first[0]  # the log's tail
            # The status follows the comment (same publish step, a moment later).
            setup_status = wait_for(
                "the first push's status",
                lambda: [s for s in github.statuses_for(broken_setup) if s["state"] != "pending"],
                30,
            )
            assert setup_status[-1]["state"] == "error"

            # main is measured (the baseline), right before the slow commit so that both run
            # under similar load on the shared machine.
            pushed = send_webhook(
                hook, SECRET, "push", push_payload("main", base, repo.clone_url), delivery="d-push"
            )
            assert pushed.status_code == 202 and pushed.json()["batches"], pushed.text

            def main_analysed() -> bool:
                got = httpx.get(f"{server.url}/api/v1/runs?branch=main", timeout=10).json()
                return any(r["status"] == "analysed" for r in got["items"])

            wait_for("main's run to be analysed", main_analysed, 120)

            # Second push: the slow commit. A replay of its delivery queues nothing more.
            sync = pr_payload("synchronize", 7, slow, base, repo.clone_url)
            synced = send_webhook(hook, SECRET, "pull_request", sync, delivery="d-sync")
            assert synced.status_code == 202, synced.text
            jobs_now = job_count()
            replay = send_webhook(hook, SECRET, "pull_request", sync, delivery="d-sync")
            assert replay.status_code == 200 and replay.json()["duplicate"] is True
            assert job_count() == jobs_now == 3

            def final_status() -> list[dict[str, Any]]:
                return [s for s in github.statuses_for(slow) if s["state"] != "pending"]

            statuses = wait_for("the slow commit's status", final_status, 150)
            body = github.bodies(REPO, 7)
            assert len(body) == 1, "the comment is updated in place, not duplicated"
            text = body[0]
            assert statuses[-1]["state"] == "failure", text + str(statuses)
            assert statuses[-1]["context"] == "cptrace/smoke"
            assert text.startswith("<!-- cptrace:suite=smoke -->")
            assert ":x: regression" in text
            # Deterministic on CPU: the broken switches' helpers start running (new findings
            # that name them); the iteration time may or may not beat the machine's noise.
            assert "new finding(s):" in text and "`cp_attention.grad_zero_fill`" in text
            assert "measured at the merge base" in text and base[:12] in text
            assert f"{PUBLIC}/compare/" in text
            patched = [r for r in github.requests if r.method == "PATCH"]
            assert len(patched) == 1
        finally:
            if agent is not None and agent.poll() is None:
                agent.terminate()
                agent.wait(timeout=30)
            server.stop()
            if agent is not None:  # shown by pytest when the test failed
                print((tmp_path / "agent.log").read_text()[-6000:])
    print(f"loop end to end: {time.monotonic() - started:.1f} s")
