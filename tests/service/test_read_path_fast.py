"""The fast read path of the run list and detail: same JSON as the models, ETags, token cache.

``GET /runs`` and ``GET /runs/{id}`` answer with bytes built straight from the rows
(``service.store.run_page_json`` / ``run_detail_json``). These tests hold them to the model path
(``list_runs``/``count_runs``/``get_run``, what the web pages use) on real analysed runs, check
the conditional GETs, and that validation, auth and the error shape did not change.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings
from fastapi.testclient import TestClient
from service_factories import auth, drain_worker, kineto_bundle, te_3arms_bundle

from service.api.deps import TokenCache, token_cache
from service.api.schemas import RunPage
from service.auth import Role, create_token, hash_token
from service.main import create_app
from service.storage.database import Database
from service.store import RunDetail, RunFilters, count_runs, get_run, list_runs

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first


def _canonical(value: Any) -> str:
    """JSON text with sorted keys: equal only when values *and* JSON types agree."""
    return json.dumps(value, sort_keys=True)


def _upload(client: TestClient, runner: dict[str, str], data: bytes) -> int:
    resp = client.post(
        "/api/v1/uploads/bundles", files={"bundle": ("b.tar.gz", data)}, headers=runner
    )
    assert resp.status_code in (200, 201), resp.text
    return int(resp.json()["run_id"])


@pytest.fixture(scope="module")
def runs(client: TestClient, runner: dict[str, str], app_env: dict[str, Any]) -> list[int]:
    """An analysed 3-arm run (metrics, window groups, report), a queued Kineto run, an empty
    API run with a manifest, and one with a stored job spec."""
    analysed = _upload(
        client, runner, te_3arms_bundle(name="fast-te", iteration_ms=[17.25, 17.5, 18.0])
    )
    drain_worker(app_env["app"].state.settings)
    queued = _upload(client, runner, kineto_bundle(name="fast-queued", salt="q", branch="dev"))
    made = client.post(
        "/api/v1/runs",
        json={"name": "hand-made", "branch": "dev", "commit": "abc_%def", "host": "h1"},
        headers=runner,
    )
    assert made.status_code == 201, made.text
    spec = {"name": "job", "steps": [1.5, 2.25], "nested": {"x": None, "ok": True}}
    with_spec = made.json()["id"]
    app_env["db"].write_tx(
        lambda c: c.execute(
            "UPDATE runs SET spec_json = ? WHERE id = ?", (json.dumps(spec), with_spec)
        )
    )
    return [analysed, queued, with_spec]


def test_detail_is_the_model_json(client: TestClient, app_env: dict[str, Any], runs: list[int]):
    db = app_env["db"]
    analysed = client.get(f"/api/v1/runs/{runs[0]}").json()
    assert analysed["status"] == "analysed" and analysed["analysis"]["status"] == "done"
    assert analysed["window_groups"] and analysed["median_ms"] is not None
    assert isinstance(analysed["findings"], int) and analysed["traces"] == 2
    for run_id in runs:
        resp = client.get(f"/api/v1/runs/{run_id}")
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/json"
        body = resp.json()
        expected = get_run(db, run_id, include_report=False).model_dump(mode="json")
        assert _canonical(body) == _canonical(expected)  # values and JSON types (2 vs 2.0)
        assert RunDetail.model_validate(body).model_dump(mode="json") == body  # the contract
    assert client.get(f"/api/v1/runs/{runs[2]}").json()["spec"]["steps"] == [1.5, 2.25]


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"limit": 2},
        {"limit": 1, "offset": 1},
        {"branch": "dev"},
        {"status": "analysed"},
        {"name": "FAST"},  # substring, case-insensitive: the thread-pool path
        {"commit": "abc_%"},  # prefix with LIKE wildcards taken literally
        {"commit": "abcx"},
        {"limit": 100000},  # capped at max_page_size
    ],
)
def test_list_is_the_model_json(
    client: TestClient, app_env: dict[str, Any], runs: list[int], params: dict[str, Any]
) -> None:
    db = app_env["db"]
    resp = client.get("/api/v1/runs", params=params)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    filters = RunFilters(**{k: v for k, v in params.items() if k not in ("limit", "offset")})
    limit = min(params.get("limit", 50), app_env["app"].state.settings.max_page_size)
    offset = params.get("offset", 0)
    expected = RunPage(
        items=list_runs(db, filters=filters, limit=limit, offset=offset),
        total=count_runs(db, filters=filters),
        limit=limit,
        offset=offset,
    )
    assert _canonical(body) == _canonical(expected.model_dump(mode="json"))
    assert RunPage.model_validate(body) == expected


def test_commit_prefix_is_literal(client: TestClient, runs: list[int]) -> None:
    found = client.get("/api/v1/runs", params={"commit": "abc_%"}).json()
    assert [r["id"] for r in found["items"]] == [runs[2]]
    assert client.get("/api/v1/runs", params={"commit": "abcx"}).json()["total"] == 0


def test_etag_answers_304_until_a_write(
    client: TestClient, runner: dict[str, str], admin: dict[str, str], runs: list[int]
) -> None:
    first = client.get("/api/v1/runs")
    tag = first.headers["etag"]
    assert first.headers["cache-control"] == "no-cache"
    again = client.get("/api/v1/runs", headers={"If-None-Match": tag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == tag
    # weak form and lists of tags match too (RFC 9110 weak comparison for GET)
    for header in (f"W/{tag}", f'"other", {tag}', "*"):
        assert client.get("/api/v1/runs", headers={"If-None-Match": header}).status_code == 304
    assert client.get("/api/v1/runs", headers={"If-None-Match": '"0.0"'}).status_code == 200

    detail = client.get(f"/api/v1/runs/{runs[1]}")
    dtag = detail.headers["etag"]
    cond = {"If-None-Match": dtag}
    assert client.get(f"/api/v1/runs/{runs[1]}", headers=cond).status_code == 304

    made = client.post("/api/v1/runs", json={"name": "etag-write"}, headers=runner)
    assert made.status_code == 201
    changed = client.get("/api/v1/runs", headers={"If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["etag"] != tag
    assert changed.json()["items"][0]["name"] == "etag-write"
    assert client.get(f"/api/v1/runs/{runs[1]}", headers=cond).status_code == 200

    # a deleted run is a 404, whatever tag the client holds
    new_id = made.json()["id"]
    ntag = client.get(f"/api/v1/runs/{new_id}").headers["etag"]
    assert client.delete(f"/api/v1/runs/{new_id}", headers=admin).status_code == 200
    for header in (ntag, "*"):
        gone = client.get(f"/api/v1/runs/{new_id}", headers={"If-None-Match": header})
        assert gone.status_code == 404 and gone.json()["ok"] is False
    assert client.get("/api/v1/runs/999999", headers={"If-None-Match": "*"}).status_code == 404


def test_state_tag_is_per_connection_and_moves_on_commit(tmp_path: Path) -> None:
    """data_version restarts on a new connection: the tag must not repeat across restarts."""
    path = tmp_path / "t.db"
    first = Database(path)
    first.write(lambda c: c.execute("CREATE TABLE t (x)"))
    tag = first.read_tagged(lambda c, t: t)
    assert first.read_tagged(lambda c, t: t) == tag  # nothing written: same tag
    first.write(lambda c: c.execute("INSERT INTO t VALUES (1)"))
    moved = first.read_tagged(lambda c, t: t)
    assert moved != tag
    second = Database(path)  # "after a restart": same data, another connection
    assert second.read_tagged(lambda c, t: t) not in (tag, moved)
    first.close()
    second.close()


def test_validation_and_errors_unchanged(client: TestClient) -> None:
    for path, params in (
        ("/api/v1/runs", {"limit": 0}),
        ("/api/v1/runs", {"offset": -1}),
        ("/api/v1/runs", {"limit": "many"}),
        ("/api/v1/runs/0", {}),
        ("/api/v1/runs/abc", {}),
    ):
        resp = client.get(path, params=params)
        assert resp.status_code == 422, (path, params, resp.text)
        body = resp.json()
        assert body["ok"] is False and body["status"] == 422 and body["errors"]
    missing = client.get("/api/v1/runs/424242")
    assert missing.status_code == 404
    assert missing.json() == {
        "ok": False,
        "error": "run 424242 does not exist",
        "errors": ["run 424242 does not exist"],
        "status": 404,
    }
    bad = client.get("/api/v1/runs", headers={"Authorization": "Bearer cpt_nope"})
    assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"


def test_openapi_keeps_the_response_models(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path, model in (("/api/v1/runs", "RunPage"), ("/api/v1/runs/{run_id}", "RunDetail")):
        get = paths[path]["get"]
        schema = get["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema["$ref"].rsplit("/", 1)[1].endswith(model)
        assert "304" in get["responses"] and "404" in get["responses"]
        assert any(p["name"] == "if-none-match" for p in get["parameters"])


def test_private_reads_need_a_token(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, public_read=False))
    db = app.state.db
    viewer = db.write_tx(lambda c: create_token(c, role=Role.VIEWER))
    with TestClient(app) as client:
        for path in ("/api/v1/runs", "/api/v1/runs/1"):
            anon = client.get(path)
            assert anon.status_code == 401 and anon.json()["ok"] is False
            assert client.get(path, headers=auth("cpt_unknown")).status_code == 401
        assert client.get("/api/v1/runs", headers=auth(viewer)).status_code == 200
        # a 304 is only given after auth: no token, no answer
        tag = client.get("/api/v1/runs", headers=auth(viewer)).headers["etag"]
        assert client.get("/api/v1/runs", headers={"If-None-Match": tag}).status_code == 401


def test_token_cache_keeps_only_verified_tokens_for_its_ttl(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, public_read=False))
    db = app.state.db
    token = db.write_tx(lambda c: create_token(c, role=Role.VIEWER))
    cache = token_cache(db)
    with TestClient(app) as client:
        assert client.get("/api/v1/runs", headers=auth("cpt_x")).status_code == 401
        assert cache.get(hash_token("cpt_x")) is None  # unknown tokens are never cached
        assert client.get("/api/v1/runs", headers=auth(token)).status_code == 200
        assert cache.get(hash_token(token)) is Role.VIEWER
        # revoked in the database: the cache answers for at most its TTL; forget() at once
        db.write_tx(lambda c: c.execute("DELETE FROM tokens"))
        assert client.get("/api/v1/runs", headers=auth(token)).status_code == 200
        cache.forget(hash_token(token))
        assert client.get("/api/v1/runs", headers=auth(token)).status_code == 401
        # a viewer token never passes a write, cached or not
        token = db.write_tx(lambda c: create_token(c, role=Role.VIEWER))
        assert client.get("/api/v1/runs", headers=auth(token)).status_code == 200
        resp = client.post("/api/v1/runs", json={"name": "x"}, headers=auth(token))
        assert resp.status_code == 403 and resp.json()["status"] == 403


def test_token_cache_expires_and_is_per_database(tmp_path: Path) -> None:
    cache = TokenCache(ttl_s=0.05)
    cache.put("h", Role.ADMIN)
    assert cache.get("h") is Role.ADMIN
    time.sleep(0.08)
    assert cache.get("h") is None
    small = TokenCache(max_entries=2)
    for i in range(3):
        small.put(str(i), Role.VIEWER)
    assert small.get("2") is Role.VIEWER and small.get("0") is None
    # a token verified against one database does not open another one
    one_app = create_app(make_settings(tmp_path / "a", public_read=False))
    other = create_app(make_settings(tmp_path / "b", public_read=False))
    token = one_app.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN))
    with TestClient(one_app) as a, TestClient(other) as b:
        assert a.get("/api/v1/runs", headers=auth(token)).status_code == 200
        assert b.get("/api/v1/runs", headers=auth(token)).status_code == 401
