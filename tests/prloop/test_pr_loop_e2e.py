"""The whole loop on CPU with real processes on loopback, no person in between.

fake GitHub (signed webhooks, contents and compare over a real bare git repository, comments,
statuses) -> ``cptrace serve`` (uvicorn + the analysis worker, which publishes) -> two real
``cptrace agent`` runners that check out each commit, run its setup command and the suite's two
entries: the CPU smoke spec on gloo, and the repository's own ``train.py`` (a tiny model with
``torch.optim`` steps over the bundled ``cp_attn``) run by ``torchrun`` under
``cptrace profile --torch`` -> the bundles uploaded and analysed -> the comment, created on the
pull request's first push (whose setup fails) and updated on the second (whose spec and script
turn on the bundled attention's broken switches: extra padding and zero-fill work), plus the
commit statuses.

On CPU the analysis attributes no GPU launches (there are none), so there are no per-helper
launch rows; the comment shows the helpers' host time instead (calls and self host ms per step,
from the ranges: cp_attention.grad_zero_fill and the per-step metadata recompute appear), and
the slow commit fails the suite's policy through the findings that appeared (the broken
switches' code paths start running: deterministic). The per-helper and per-kernel launch
deltas of the comment are checked on real H200 traces in test_pr_loop_units.py.

Time: two runners share the jobs (a batch's spec and command run side by side), main's push and
the failing setup are sent together, the slow push follows main's uploads (not their analyses:
the worker analyses in upload order), the spec runs six timed steps, and the idle processes are
killed at the end; the spec's ranks start the PyTorch profiler without importing inductor
(``runners/profile/lean_start.py``) and are forked from one torch import
(``runners/forkrun.py``): 24 s of CPU for the test and its processes (``--cpu-durations``),
31 s with torchrun starting the spec's ranks. The timeline of the phases is printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
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
RUNNERS = 2


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


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float,
    procs: Sequence[subprocess.Popen[bytes]] = (),
) -> Any:
    """``check()`` once it is truthy; fails at once when one of ``procs`` (the runners, which
    idle until they are killed) exited: nothing could come any more (a runner that cannot start,
    as without bubblewrap, used to cost the whole timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        gone = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None]
        if gone:
            raise AssertionError(f"runners {gone} (index, status) exited waiting for {what}")
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.slow
def test_pull_request_loop_end_to_end(tmp_path: Path) -> None:
    started = time.monotonic()
    marks: list[str] = []

    def mark(what: str) -> None:  # where the time goes, printed at the end
        marks.append(f"{time.monotonic() - started:6.1f} s  {what}")

    repo = LoopRepo(tmp_path / "git")
    base = repo.commit("baseline workload", spec=SMOKE_SPEC, train_broken=False)
    repo.push("main")
    repo.git("checkout", "-qb", "feature")
    broken_setup = repo.commit(
        "setup that cannot work",
        spec=SMOKE_SPEC,
        train_broken=False,
        setup="echo installing the package; echo 'error: no such package: cp-attn' >&2; exit 3",
    )
    slow_spec = {**SMOKE_SPEC, "broken_identity_padding": True, "broken_always_zero_fill": True}
    slow = repo.commit(
        "pad and zero-fill everything", spec=slow_spec, train_broken=True, setup="echo setup ok"
    )
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
        mark("service up")
        agents: list[subprocess.Popen[bytes]] = []
        try:
            # The runners start now: their start-up overlaps the first deliveries.
            for i in range(RUNNERS):
                args = [
                    sys.executable, "-c", "from cptrace.cli import main; main()", "agent",
                    "--server", server.url,
                    "--name", f"cpu-{i}", "--gpus", "0", "--max-idle-polls", "240",
                    "--wait", "1", "--heartbeat", "2", "--work-dir", str(tmp_path / f"agent{i}"),
                ]  # fmt: skip
                log = (tmp_path / f"agent{i}.log").open("w")
                agents.append(
                    subprocess.Popen(
                        args,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, "CPTRACE_TOKEN": server.admin_token or ""},
                        start_new_session=True,
                    )
                )
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

            # The pull request's first push (its setup fails) and main's push (the baseline)
            # are queued together: two jobs each, one per suite entry.
            opened = send_webhook(
                hook, SECRET, "pull_request",
                pr_payload("opened", 7, broken_setup, base, repo.clone_url), delivery="d-open",
            )  # fmt: skip
            assert opened.status_code == 202 and opened.json()["batches"], opened.text
            pushed = send_webhook(
                hook, SECRET, "push", push_payload("main", base, repo.clone_url), delivery="d-push"
            )
            assert pushed.status_code == 202 and pushed.json()["batches"], pushed.text
            assert job_count() == 4

            # First push of the PR: its setup fails -> the comment says so, status error.
            first = wait_for(
                "the comment on the first push", lambda: github.bodies(REPO, 7), 120, agents
            )
            mark("first comment (setup failed)")
            assert len(first) == 1
            assert "setup command failed" in first[0] and "exited with status 3" in first[0]
            assert "no such package: cp-attn" in first[0]  # the log's tail
            assert "`train`" in first[0] and "`loop-smoke`" in first[0]  # both entries failed
            # The status follows the comment (same publish step, a moment later).
            setup_status = wait_for(
                "the first push's status",
                lambda: [s for s in github.statuses_for(broken_setup) if s["state"] != "pending"],
                30,
                agents,
            )
            assert setup_status[-1]["state"] == "failure"

            def main_uploaded() -> bool:
                got = httpx.get(f"{server.url}/api/v1/runs?branch=main", timeout=10).json()
                return len(got["items"]) == 2

            # The slow commit is pushed once main's runs are uploaded: the worker analyses
            # runs in upload order, so they are analysed (the baseline) before the slow
            # commit's runs, and its comment must say it found them at the merge base.
            wait_for("main's two runs to be uploaded", main_uploaded, 180, agents)
            mark("main's spec and command runs uploaded")
            main_runs = httpx.get(f"{server.url}/api/v1/runs?branch=main", timeout=10).json()
            assert {r["name"] for r in main_runs["items"]} == {"loop-smoke", "train"}

            # Second push: the slow commit. A replay of its delivery queues nothing more.
            sync = pr_payload("synchronize", 7, slow, base, repo.clone_url)
            synced = send_webhook(hook, SECRET, "pull_request", sync, delivery="d-sync")
            assert synced.status_code == 202, synced.text
            jobs_now = job_count()
            replay = send_webhook(hook, SECRET, "pull_request", sync, delivery="d-sync")
            assert replay.status_code == 200 and replay.json()["duplicate"] is True
            assert job_count() == jobs_now == 6

            def final_status() -> list[dict[str, Any]]:
                return [s for s in github.statuses_for(slow) if s["state"] != "pending"]

            statuses = wait_for("the slow commit's status", final_status, 180, agents)
            mark("slow commit published")
            body = github.bodies(REPO, 7)
            assert len(body) == 1, "the comment is updated in place, not duplicated"
            text = body[0]
            assert statuses[-1]["state"] == "failure", text + str(statuses)
            assert statuses[-1]["context"] == "cptrace/smoke"
            assert text.startswith("<!-- cptrace:suite=smoke -->")
            assert ":x: regression" in text
            spec_part, train_part = _sections(text, "loop-smoke"), _sections(text, "train")
            for part in (spec_part, train_part):
                # Deterministic on CPU: the broken switches' helpers start running (new
                # findings that name them) and their host time appears in the helper table.
                assert ":x: regression" in part.splitlines()[0], part
                assert "new finding(s):" in part and "`cp_attention.grad_zero_fill`" in part
                assert "measured at the merge base" in part and base[:12] in part
                assert "Per-helper host time" in part
                assert "Host time grew most in `" in part
                zero_fill = next(
                    line for line in part.splitlines()
                    if line.startswith("| `cp_attention.grad_zero_fill` |")
                )  # fmt: skip
                assert zero_fill.rstrip().endswith("| appeared |"), zero_fill
            assert f"{PUBLIC}/compare/" in text
            patched = [r for r in github.requests if r.method == "PATCH"]
            assert len(patched) == 1
            # The command entry's runs carry its configuration key; the spec's carry none.
            keys = _entry_keys(server)
            assert keys["train"] and len(set(keys["train"])) == 1 and keys["loop-smoke"] == [None]
            mark("comment and runs checked")
        finally:
            # Everything is checked (or failed): the runners (idle now) and the service are
            # killed as process groups; their graceful stops are tested elsewhere and cost
            # seconds here.
            for agent in agents:
                if agent.poll() is None:
                    os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(timeout=30)
            server.kill()
            mark("runners and service stopped")
            for i in range(len(agents)):  # shown by pytest when the test failed
                print((tmp_path / f"agent{i}.log").read_text()[-4000:])
    mark("done")
    print("loop end to end:\n" + "\n".join(marks))


def _sections(text: str, entry: str) -> str:
    """The comment's section of one suite entry (from its heading to the next)."""
    start = text.index(f"#### `{entry}`:")
    end = text.find("\n#### `", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _entry_keys(server: Server) -> dict[str, list[str | None]]:
    """entry name -> the distinct ``entry_key`` tags of its runs (from the stored manifests)."""
    import sqlite3

    with sqlite3.connect(server.data_dir / "cptrace.db") as conn:
        found = conn.execute(
            "SELECT name, json_extract(manifest_json, '$.run.entry_key') FROM runs ORDER BY id"
        ).fetchall()
    out: dict[str, list[str | None]] = {}
    for name, key in found:
        if key not in out.setdefault(name, []):
            out[name].append(key)
    return out
