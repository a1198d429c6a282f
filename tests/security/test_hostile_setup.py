"""A pull request's setup command hunts for the runner's credentials and finds none; nothing
token-shaped it prints reaches the job log or the pull-request comment (issue 24, item 1).

Real everything: ``cptrace serve`` with the fake GitHub, a real ``cptrace agent`` whose token
is in a 0600 file and whose environment holds a GitHub token and an AWS key (as a careless host
would), a signed webhook for a pull request whose ``.cptrace.yml`` setup is the hunt.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fake_github import FakeGitHubServer, send_webhook
from loop_repo import SMOKE_SPEC, LoopRepo
from service_server import Server, wait_for

from contracts.redaction import REDACTED, looks_secret

REPO = "octo/model"
SECRET = "webhook-secret-for-hostile-tests"
HOST_GITHUB_TOKEN = "ghp_" + "H0st" * 9
HOST_AWS_SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
# Built at run time, so the checkout's own files hold no token-shaped text.
PATTERN = r"cpt_[A-Za-z0-9_-]{20}|gh[p]_[A-Za-z0-9]{30}|wJalr[X]Utn"


def hunt_script(token_file: Path, work_dir: Path, home: Path) -> str:
    """Look everywhere a same-uid process could: every process's environ and cmdline, the
    agent's token file, work dir and home; print every hit, and some token-shaped text."""
    return f"""
found=0
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  if tr '\\0' '\\n' < "$f" 2>/dev/null | grep -qE '{PATTERN}'; then echo "FOUND in $f"; found=1; fi
done
for f in $(grep -rlsE '{PATTERN}' {token_file} {work_dir} {home} 2>/dev/null); do
  echo "FOUND file $f"; found=1
done
cat {token_file} 2>/dev/null && echo "FOUND token file readable"
echo "leak: gh""p_$(printf 'x%.0s' $(seq 36))"
echo "Authorization: Bearer sekrit-bearer-$(printf 'y%.0s' $(seq 12))"
echo "HUNT-DONE processes=$(ls -d /proc/[0-9]* | wc -l) found=$found"
exit 7
"""


def _pr(head: str, clone_url: str) -> dict[str, object]:
    return {
        "action": "opened",
        "number": 7,
        "pull_request": {
            "number": 7,
            "head": {"sha": head, "ref": "feature", "repo": {"full_name": REPO}},
            "base": {"sha": head, "ref": "main", "repo": {"full_name": REPO}},
        },
        "repository": {"full_name": REPO, "clone_url": clone_url},
    }


def _agent_files(tmp_path: Path, token: str) -> tuple[Path, Path, Path]:
    secrets_dir = tmp_path / "agent-secrets"
    secrets_dir.mkdir()
    token_file = secrets_dir / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    home = tmp_path / "agent-home"
    home.mkdir()
    (home / ".git-credentials").write_text(f"https://bot:{HOST_GITHUB_TOKEN}@github.com\n")
    return token_file, tmp_path / "agent-work", home


def test_the_hunt_works_outside_the_sandbox(tmp_path: Path) -> None:
    """The same script, run plainly on the host, does find the planted secrets (so the
    sandboxed run finding nothing means something)."""
    token_file, work, home = _agent_files(tmp_path, "cpt_" + "T" * 40)
    work.mkdir()
    done = subprocess.run(
        ["bash", "-c", hunt_script(token_file, work, home)], capture_output=True, text=True,
        env={**os.environ, "GITHUB_TOKEN": HOST_GITHUB_TOKEN}, check=False,
    )  # fmt: skip
    assert f"FOUND file {token_file}" in done.stdout, done.stdout
    assert f"FOUND file {home / '.git-credentials'}" in done.stdout
    assert "FOUND token file readable" in done.stdout


@pytest.mark.slow
def test_hostile_setup_finds_no_secret_and_publishes_none(tmp_path: Path) -> None:
    repo = LoopRepo(tmp_path / "git")
    with FakeGitHubServer() as github:
        github.git_dirs[REPO] = repo.bare
        env = {
            "GITHUB_TOKEN": github.token,
            "GITHUB_API_URL": github.url,
            "CPTRACE_GITHUB_WEBHOOK_SECRET": SECRET,
            "CPTRACE_GITHUB_PUBLISH_INTERVAL_S": "0.2",
            "CPTRACE_WORKER_POLL_S": "0.2",
        }
        (tmp_path / "data").mkdir()
        server = Server(tmp_path / "data", env=env).start()
        runner_token = subprocess.run(
            [sys.executable, "-c", "from cptrace.cli import main; main()", "token", "create",
             "--role", "runner", "--runner", "hostile-host", "--data-dir", str(tmp_path / "data")],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        token_file, work, home = _agent_files(tmp_path, runner_token)
        head = repo.commit(
            "hunt", spec=SMOKE_SPEC, setup=hunt_script(token_file, work, home)
        )
        repo.push("HEAD:refs/heads/feature")
        agent_env = {
            **{k: v for k, v in os.environ.items() if k not in ("CPTRACE_TOKEN", "GITHUB_TOKEN")},
            "HOME": str(home),
            "GITHUB_TOKEN": HOST_GITHUB_TOKEN,
            "AWS_SECRET_ACCESS_KEY": HOST_AWS_SECRET,
            "CPTRACE_TOKEN_FILE": str(token_file),
        }
        log = (tmp_path / "agent.log").open("w")
        agent = subprocess.Popen(
            [sys.executable, "-c", "from cptrace.cli import main; main()", "agent",
             "--server", server.url, "--name", "hostile-host", "--gpus", "0",
             "--max-idle-polls", "120", "--wait", "1", "--heartbeat", "2",
             "--work-dir", str(work)],
            stdout=log, stderr=subprocess.STDOUT, env=agent_env, start_new_session=True,
        )  # fmt: skip
        try:
            hook = f"{server.url}/api/v1/github/webhook"
            sent = send_webhook(hook, SECRET, "pull_request", _pr(head, repo.clone_url))
            assert sent.status_code == 202 and sent.json()["batches"], sent.text
            bodies = wait_for(lambda: github.bodies(REPO, 7), 120, "the comment")
            jobs = httpx.get(f"{server.url}/api/v1/jobs", headers=server.headers, timeout=10)
            job = httpx.get(
                f"{server.url}/api/v1/jobs/{jobs.json()[0]['id']}", headers=server.headers,
                timeout=10,
            ).json()  # fmt: skip
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(timeout=30)
            server.kill()
            print((tmp_path / "agent.log").read_text()[-4000:])
    tail = job["log_tail"] or ""
    assert job["status"] == "failed" and "HUNT-DONE" in tail, job
    assert "found=0" in tail and not re.search(r"^FOUND", tail, re.M), tail
    assert "processes=" in tail and "processes=1\n" not in tail
    assert REDACTED in tail, "the token-shaped lines the setup printed are redacted"
    for text in (tail, job["reason"] or "", bodies[0]):
        assert runner_token not in text and HOST_GITHUB_TOKEN not in text
        assert HOST_AWS_SECRET not in text and "sekrit-bearer" not in text
        assert not looks_secret(text), text
    assert "HUNT-DONE" in bodies[0], "the comment shows the (redacted) log tail"
