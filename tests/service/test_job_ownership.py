"""Job ownership on a real ``cptrace serve``: a runner token acts only on the jobs it claimed,
a bound token claims only under its runner name, admins act on any job."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fault_support import record
from service_factories import SPEC_YAML, auth
from service_server import Server

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first


def _token(data_dir: Path, *args: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cptrace.cli import main; main()",
            "token",
            "create",
            "--data-dir",
            str(data_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    data_dir = tmp_path_factory.mktemp("jobs")
    server = Server(data_dir, worker=False).start()
    try:
        yield {
            "server": server,
            "admin": server.headers,
            "alice": auth(_token(data_dir, "--role", "runner", "--runner", "alice")),
            "bob": auth(_token(data_dir, "--role", "runner", "--name", "bob-host")),
        }
    finally:
        server.kill()


def _call(env: dict[str, object], who: str, method: str, path: str, body: object = None):  # type: ignore[no-untyped-def]
    server = env["server"]
    assert isinstance(server, Server)
    return httpx.request(
        method,
        f"{server.url}/api/v1{path}",
        json=body,
        headers=env[who],
        timeout=30,  # type: ignore[arg-type]
    )


def _submit_and_claim(env: dict[str, object], who: str, runner: str) -> int:
    job = _call(env, "admin", "POST", "/jobs", {"spec_yaml": SPEC_YAML})
    assert job.status_code == 201, job.text
    claim = _call(env, who, "POST", "/jobs/claim", {"runner": runner})
    assert claim.status_code == 200, claim.text
    assert claim.json()["id"] == job.json()["id"]
    return int(claim.json()["id"])


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("heartbeat", {}),
        ("complete", {"run_id": None}),
        ("fail", {"reason": "not mine"}),
        ("release", {}),
    ],
)
def test_another_runners_job_actions_are_403(
    env: dict[str, object], action: str, body: dict[str, object]
) -> None:
    job_id = _submit_and_claim(env, "alice", "alice")
    resp = _call(env, "bob", "POST", f"/jobs/{job_id}/{action}", body)
    assert resp.status_code == 403, resp.text
    assert "another runner" in resp.json()["error"]
    state = _call(env, "admin", "GET", f"/jobs/{job_id}").json()
    assert state["status"] == "running" and state["runner"] == "alice"  # untouched
    mine = _call(env, "alice", "POST", f"/jobs/{job_id}/heartbeat", {})
    assert mine.status_code == 200, mine.text
    done = _call(env, "alice", "POST", f"/jobs/{job_id}/fail", {"reason": "test over"})
    assert done.status_code == 200, done.text
    record(
        f"runner token B calls `{action}` on a job runner A claimed",
        "403; the job stays A's",
        f"{resp.status_code} '{resp.json()['error'][:80]}'; A's heartbeat 200",
    )


def test_admin_may_act_on_any_job(env: dict[str, object]) -> None:
    job_id = _submit_and_claim(env, "bob", "bob-host")
    resp = _call(env, "admin", "POST", f"/jobs/{job_id}/fail", {"reason": "admin stop"})
    assert resp.status_code == 200, resp.text
    assert _call(env, "admin", "GET", f"/jobs/{job_id}").json()["status"] == "failed"


def test_bound_token_claims_only_under_its_name(env: dict[str, object]) -> None:
    resp = _call(env, "alice", "POST", "/jobs/claim", {"runner": "mallory"})
    assert resp.status_code == 403, resp.text
    assert "alice" in resp.json()["error"]
    record(
        "a token bound with `--runner alice` claims as 'mallory'",
        "403",
        f"{resp.status_code} '{resp.json()['error']}'",
    )


def test_token_create_refuses_runner_on_other_roles(env: dict[str, object]) -> None:
    server = env["server"]
    assert isinstance(server, Server)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cptrace.cli import main; main()",
            "token",
            "create",
            "--data-dir",
            str(server.data_dir),
            "--role",
            "admin",
            "--runner",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "--runner" in out.stdout + out.stderr
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cptrace.cli import main; main()",
            "token",
            "list",
            "--data-dir",
            str(server.data_dir),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "runner=alice" in listed
