"""A runner token is one runner: bound to the first name it claims under (no other token may
use it), it completes a job only with a run it uploaded, and claim/release cycles run out of
attempts (issue 24, item 14)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_factories import auth, kineto_bundle

from service.auth import Role, create_token
from service.core.config import Settings
from service.jobs import MAX_FREE_RELEASES
from service.main import create_app

SPEC = {"name": "ident", "implementation": "bundled", "device": "cpu", "ranks": 1}


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    app = create_app(Settings(data_dir=tmp_path / "data", ingest_workers=0, claim_max_wait_s=0))
    db = app.state.db
    tokens = {
        "admin": db.write_tx(lambda c: create_token(c, role=Role.ADMIN)),
        "a": db.write_tx(lambda c: create_token(c, role=Role.RUNNER)),
        "b": db.write_tx(lambda c: create_token(c, role=Role.RUNNER)),
    }
    with TestClient(app) as client:
        yield {"client": client, "tokens": tokens}


def _call(env: dict[str, Any], who: str, method: str, path: str, **kw: Any) -> Any:
    headers = {**auth(env["tokens"][who]), **kw.pop("headers", {})}
    return env["client"].request(method, f"/api/v1{path}", headers=headers, **kw)


def _job(env: dict[str, Any], max_attempts: int = 2) -> int:
    answer = _call(env, "admin", "POST", "/jobs", json={"spec": SPEC, "max_attempts": max_attempts})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def _claim(env: dict[str, Any], who: str, runner: str) -> Any:
    return _call(env, who, "POST", "/jobs/claim", json={"runner": runner, "gpus": 0, "wait_s": 0})


def _upload(env: dict[str, Any], who: str, salt: str) -> int:
    answer = _call(
        env, who, "POST", "/uploads/bundles", content=kineto_bundle(name="r", salt=salt),
        headers={"Content-Type": "application/gzip"},
    )  # fmt: skip
    assert answer.status_code == 201, answer.text
    return int(answer.json()["run_id"])


def test_an_unbound_token_is_bound_by_its_first_claim(env: dict[str, Any]) -> None:
    _job(env)
    assert _claim(env, "a", "gpu-1").status_code == 200
    other_name = _claim(env, "a", "gpu-2")
    assert other_name.status_code == 403 and "bound to runner 'gpu-1'" in other_name.text
    taken = _claim(env, "b", "gpu-1")
    assert taken.status_code == 403 and "another token" in taken.text
    assert _claim(env, "b", "gpu-3").status_code in (200, 204)


def test_a_job_completes_only_with_a_run_its_token_uploaded(env: dict[str, Any]) -> None:
    job = _job(env)
    assert _claim(env, "a", "gpu-1").status_code == 200
    foreign = _upload(env, "b", "from-b")
    refused = _call(env, "a", "POST", f"/jobs/{job}/complete", json={"run_id": foreign})
    assert refused.status_code == 403 and "not uploaded by this runner" in refused.text
    own = _upload(env, "a", "from-a")
    done = _call(env, "a", "POST", f"/jobs/{job}/complete", json={"run_id": own})
    assert done.status_code == 200, done.text
    second = _job(env)
    assert _claim(env, "a", "gpu-1").json()["id"] == second
    reused = _call(env, "a", "POST", f"/jobs/{second}/complete", json={"run_id": own})
    assert reused.status_code == 409 and f"job {job}" in reused.text


def test_claim_release_cycles_use_up_attempts(env: dict[str, Any]) -> None:
    job = _job(env, max_attempts=2)
    cycles = 0
    while cycles < 20:
        claimed = _claim(env, "a", "gpu-1")
        if claimed.status_code == 204:
            break
        assert claimed.json()["id"] == job
        assert _call(env, "a", "POST", f"/jobs/{job}/release").status_code == 200
        cycles += 1
    final = _call(env, "admin", "GET", f"/jobs/{job}").json()
    assert final["status"] == "failed", final
    assert cycles == MAX_FREE_RELEASES + 2
