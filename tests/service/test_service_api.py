"""Runs API, auth roles and the one error shape across endpoints."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_factories import auth, kineto_bundle

from service.core.config import Settings
from service.main import create_app

ERROR_KEYS = {"ok", "error", "errors", "status"}


def _assert_error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == ERROR_KEYS
    assert body["ok"] is False and body["status"] == status
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["errors"], list) and body["errors"]
    return body


@pytest.fixture(scope="module")
def seeded(client: TestClient, runner: dict[str, str]) -> list[int]:
    ids = []
    for i, branch in enumerate(["main", "main", "feature/x"]):
        resp = client.post(
            "/api/v1/runs",
            json={"name": f"seed-{i}", "branch": branch, "commit": f"c0ffee{i}"},
            headers=runner,
        )
        ids.append(resp.json()["id"])
    return ids


def test_list_filters_and_paging(client: TestClient, seeded: list[int]) -> None:
    page = client.get("/api/v1/runs", params={"limit": 2}).json()
    assert page["total"] >= 3 and len(page["items"]) == 2 and page["limit"] == 2
    assert page["items"][0]["id"] > page["items"][1]["id"]  # newest first
    rest = client.get("/api/v1/runs", params={"limit": 2, "offset": 2}).json()
    assert {r["id"] for r in rest["items"]}.isdisjoint({r["id"] for r in page["items"]})
    feature = client.get("/api/v1/runs", params={"branch": "feature/x"}).json()
    assert [r["name"] for r in feature["items"]] == ["seed-2"]
    by_name = client.get("/api/v1/runs", params={"name": "SEED-1"}).json()
    assert [r["id"] for r in by_name["items"]] == [seeded[1]]
    by_commit = client.get("/api/v1/runs", params={"commit": "c0ffee0"}).json()
    assert [r["id"] for r in by_commit["items"]] == [seeded[0]]
    odd = client.get("/api/v1/runs", params={"commit": "%_"}).json()
    assert odd["total"] == 0  # LIKE wildcards are escaped
    status = client.get("/api/v1/runs", params={"status": "empty"}).json()
    assert {r["id"] for r in status["items"]} >= set(seeded)


def test_detail_and_delete(
    client: TestClient, admin: dict[str, str], runner: dict[str, str], seeded: list[int]
) -> None:
    detail = client.get(f"/api/v1/runs/{seeded[0]}").json()
    assert detail["name"] == "seed-0" and detail["files"] == [] and detail["report"] is None
    _assert_error(client.delete(f"/api/v1/runs/{seeded[0]}", headers=runner), 403)
    assert client.delete(f"/api/v1/runs/{seeded[0]}", headers=admin).json() == {"ok": True}
    _assert_error(client.get(f"/api/v1/runs/{seeded[0]}"), 404)
    _assert_error(client.delete(f"/api/v1/runs/{seeded[0]}", headers=admin), 404)


def test_delete_removes_an_uploaded_run_and_allows_reupload(
    client: TestClient, admin: dict[str, str], runner: dict[str, str]
) -> None:
    data = kineto_bundle(salt="delete-me")
    files = {"bundle": ("b.tar.gz", data)}
    first = client.post("/api/v1/uploads/bundles", files=files, headers=runner).json()
    assert client.delete(f"/api/v1/runs/{first['run_id']}", headers=admin).status_code == 200
    again = client.post("/api/v1/uploads/bundles", files=files, headers=runner)
    assert again.status_code == 201 and again.json()["run_id"] != first["run_id"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/runs", {"name": "x"}),
        ("delete", "/api/v1/runs/1", None),
        ("post", "/api/v1/jobs", {"spec_yaml": "name: x"}),
        ("post", "/api/v1/jobs/claim", {"runner": "r"}),
        ("post", "/api/v1/jobs/1/heartbeat", {}),
        ("post", "/api/v1/comparisons", {"base_run_id": 1, "head_run_id": 2}),
        ("post", "/api/v1/runs/1/analysis", None),
    ],
)
def test_writes_need_the_right_token(
    client: TestClient, viewer: dict[str, str], method: str, path: str, body: Any
) -> None:
    kwargs = {"json": body} if body is not None else {}
    missing = _assert_error(getattr(client, method)(path, **kwargs), 401)
    assert "bearer token" in missing["error"]
    wrong = getattr(client, method)(path, headers=auth("cpt_not-a-real-token"), **kwargs)
    assert "not valid" in _assert_error(wrong, 401)["error"]
    as_viewer = _assert_error(getattr(client, method)(path, headers=viewer, **kwargs), 403)
    assert "viewer" in as_viewer["error"]


def test_uploads_need_a_token(client: TestClient, viewer: dict[str, str]) -> None:
    files = {"bundle": ("b.tar.gz", b"x")}
    _assert_error(client.post("/api/v1/uploads/bundles", files=files), 401)
    _assert_error(client.post("/api/v1/uploads/bundles", files=files, headers=viewer), 403)
    _assert_error(
        client.post("/api/v1/uploads/traces", files={"trace": ("t", b"x")}, headers=viewer), 403
    )


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("get", "/api/v1/runs/999999", {}, 404),
        ("get", "/api/v1/runs/abc", {}, 422),
        ("get", "/api/v1/runs", {"params": {"limit": -1}}, 422),
        ("get", "/api/v1/runs/999999/analysis", {}, 404),
        ("get", "/api/v1/jobs/999999", {}, 404),
        ("get", "/api/v1/comparisons/999999", {}, 404),
        ("get", "/api/v1/no-such-thing", {}, 404),
        (
            "post",
            "/api/v1/runs",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            422,
        ),
        ("post", "/api/v1/jobs/claim", {"json": {"runner": ""}}, 422),
        ("put", "/api/v1/health", {}, 405),
    ],
)
def test_error_shape(
    client: TestClient,
    admin: dict[str, str],
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
) -> None:
    headers = {**admin, **kwargs.pop("headers", {})}
    _assert_error(getattr(client, method)(path, headers=headers, **kwargs), status)


def test_invalid_manifest_on_create(client: TestClient, runner: dict[str, str]) -> None:
    body = _assert_error(
        client.post(
            "/api/v1/runs",
            json={
                "name": "m",
                "manifest": {
                    "schema_version": 1,
                    "variants": [{"name": "a", "facts": {"cu_seqlens": [5, 1]}}],
                },
            },
            headers=runner,
        ),
        422,
    )
    assert "cu_seqlens" in body["error"]


def test_private_reads_need_a_token(tmp_path: Any) -> None:
    from service.auth import Role, create_token

    app = create_app(Settings(data_dir=tmp_path, public_read=False, ingest_workers=0))
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.VIEWER))
    with TestClient(app) as client:
        _assert_error(client.get("/api/v1/runs"), 401)
        assert client.get("/api/v1/runs", headers=auth(token)).status_code == 200


def test_health_and_catalog(client: TestClient) -> None:
    health = client.get("/api/v1/health").json()
    assert health["ok"] is True and health["runs"] >= 0
    catalog = client.get("/api/v1/catalog")
    assert catalog.status_code == 200
    assert "get_cu_seqlens_on_cp_rank" in catalog.text
