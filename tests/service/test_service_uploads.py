"""Uploads through the API: stored once, idempotent, and bad input refused with nothing stored."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_factories import (
    KINETO_RANK0,
    NSYS_SINGLE,
    bundle_with,
    gzip_bomb,
    kineto_bundle,
    manifest_for,
    sqlite_with,
    tar_gz,
    tar_gz_bomb,
)

BUNDLES = "/api/v1/uploads/bundles"
TRACES = "/api/v1/uploads/traces"


def _stored(app_env: dict[str, Any]) -> dict[str, int]:
    """What is persisted: rows that make runs visible, blob files on disk, leftover temp files."""
    db = app_env["db"]
    counts = db.read(
        lambda c: {
            t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("runs", "run_files", "uploads", "analysis_tasks")
        }
    )
    data_dir: Path = app_env["data_dir"]
    counts["blob_files"] = sum(1 for p in (data_dir / "blobs").rglob("*") if p.is_file())
    counts["tmp_files"] = sum(1 for p in (data_dir / "tmp").rglob("*") if p.is_file())
    return counts


FORMS = ("multipart", "raw")
"""The two bodies of a bundle upload: a form field ``bundle``, or the bundle as the body."""


def post_bundle(
    client: TestClient, data: bytes, headers: dict[str, str], form: str = "multipart", **kw: Any
) -> Any:
    if form == "raw":
        return client.post(
            BUNDLES, content=data, headers={**headers, "Content-Type": "application/gzip"}, **kw
        )
    return client.post(
        BUNDLES, files={"bundle": ("b.tar.gz", data, "application/gzip")}, headers=headers, **kw
    )


@pytest.mark.parametrize("form", FORMS)
def test_bundle_upload_creates_run_once(
    form: str, client: TestClient, runner: dict[str, str], app_env: dict[str, Any]
) -> None:
    data = kineto_bundle(name="upload-once", salt=f"once-{form}")
    key = {"Idempotency-Key": hashlib.sha256(data).hexdigest()}
    first = post_bundle(client, data, {**runner, **key}, form)
    assert first.status_code == 201, first.text
    body = first.json()
    assert body["created"] is True
    timing = first.headers["server-timing"]  # the server's phases, for the benchmark
    for phase in ("receive", "stage", "record", "total", "stage-read", "stage-check"):
        assert f"{phase};dur=" in timing, timing
    before = _stored(app_env)
    for again_form in FORMS:  # the same bytes in either body are the same upload
        again = post_bundle(client, data, {**runner, **key}, again_form)
        assert again.status_code == 200
        assert again.json() == {**body, "created": False}
        assert _stored(app_env) == before
    run = client.get(f"/api/v1/runs/{body['run_id']}").json()
    assert run["name"] == "upload-once"
    assert run["branch"] == "main"
    traces = [f for f in run["files"] if f["role"] == "trace"]
    assert [(f["name"], f["format"], f["rank"]) for f in traces] == [
        ("traces/rank0.json.gz", "kineto+gzip", 0),
        ("traces/rank1.json.gz", "kineto+gzip", 1),
    ]
    assert run["analysis"]["status"] == "queued"
    assert run["config_key"]


def test_identical_traces_are_one_blob(
    client: TestClient, runner: dict[str, str], app_env: dict[str, Any]
) -> None:
    before = _stored(app_env)
    # same traces, different manifest: a new run, one new blob (the manifest), no trace copies
    resp = post_bundle(client, kineto_bundle(name="dedup", salt="other"), runner)
    assert resp.status_code == 201
    after = _stored(app_env)
    assert after["runs"] == before["runs"] + 1
    assert after["blob_files"] == before["blob_files"] + 1


def test_single_trace_upload_new_run_and_attach(client: TestClient, runner: dict[str, str]) -> None:
    data = NSYS_SINGLE.read_bytes()
    resp = client.post(
        TRACES, files={"trace": ("../../etc/passwd", data)}, data={"rank": "0"}, headers=runner
    )
    assert resp.status_code == 201, resp.text
    run = client.get(f"/api/v1/runs/{resp.json()['run_id']}").json()
    assert run["files"][0]["format"] == "nsys"  # a .sqlite.gz is stored inflated
    assert run["files"][0]["name"] == "../../etc/passwd"  # a label only, never a path
    created = client.post("/api/v1/runs", json={"name": "by-hand"}, headers=runner)
    assert created.status_code == 201 and created.json()["status"] == "empty"
    run_id = created.json()["id"]
    attach = client.post(
        f"{TRACES}?run_id={run_id}",
        files={"trace": ("r0.json.gz", KINETO_RANK0.read_bytes())},
        headers=runner,
    )
    assert attach.status_code == 201 and attach.json()["run_id"] == run_id
    assert client.get(f"/api/v1/runs/{run_id}/analysis").json()["status"] == "queued"


def _bad_bundles(tmp: Path) -> dict[str, Callable[[], tuple[bytes, int, str]]]:
    """Each case builds its bundle lazily (the bombs are large to build)."""
    kineto = KINETO_RANK0.read_bytes()
    good_manifest = json.dumps(manifest_for([("traces/r0.json.gz", kineto, "kineto", 0)])).encode()
    truncated = kineto_bundle(name="trunc", salt="t")
    return {
        "truncated gzip": lambda: (truncated[: len(truncated) // 2], 400, "truncated"),
        "not gzip or tar": lambda: (b"hello, not a bundle" * 10, 400, "tar"),
        "invalid trace JSON": lambda: (
            bundle_with("traces/r0.json", b'{"traceEvents": [1, 2', "kineto"),
            400,
            "invalid JSON",
        ),
        "invalid manifest JSON": lambda: (
            tar_gz([("manifest.json", b"{not json"), ("traces/r0.json.gz", kineto)]),
            400,
            "manifest.json",
        ),
        "manifest field": lambda: (
            tar_gz(
                [
                    (
                        "manifest.json",
                        json.dumps({**json.loads(good_manifest), "schema_version": "x"}).encode(),
                    ),
                    ("traces/r0.json.gz", kineto),
                ]
            ),
            422,
            "schema_version",
        ),
        "sqlite with trigger": lambda: (
            bundle_with("traces/a.sqlite", sqlite_with(tmp, trigger=True), "nsys"),
            422,
            "trigger",
        ),
        "sqlite with view": lambda: (
            bundle_with("traces/a.sqlite", sqlite_with(tmp, view=True), "nsys"),
            422,
            "view",
        ),
        "path traversal": lambda: (
            tar_gz([("manifest.json", good_manifest), ("traces/../../evil.json.gz", kineto)]),
            400,
            "traversal",
        ),
        "absolute path": lambda: (
            tar_gz([("manifest.json", good_manifest), ("/etc/x", kineto)]),
            400,
            "absolute",
        ),
        "symlink": lambda: (
            tar_gz(
                [("manifest.json", good_manifest), ("traces/r0.json.gz", kineto)],
                links=[("traces/link", "/etc/passwd")],
            ),
            400,
            "symlink",
        ),
        "sha mismatch": lambda: (
            tar_gz([("manifest.json", good_manifest), ("traces/r0.json.gz", gzip.compress(b"{}"))]),
            422,
            "sha256",
        ),
        "no manifest": lambda: (tar_gz([("traces/r0.json.gz", kineto)]), 400, "manifest.json"),
        "NaN in the manifest": lambda: (
            tar_gz(
                [
                    ("manifest.json", good_manifest.replace(b'"cp_size": 2', b'"cp_size": NaN')),
                    ("traces/r0.json.gz", kineto),
                ]
            ),
            400,
            "NaN is not a JSON number",
        ),
        "manifest nested 2000 deep": lambda: (
            tar_gz(
                [
                    (
                        "manifest.json",
                        good_manifest[:-1] + b', "x": ' + b"[" * 2000 + b"]" * 2000 + b"}",
                    ),
                    ("traces/r0.json.gz", kineto),
                ]
            ),
            400,
            "nested deeper",
        ),
        "run name too long": lambda: (
            tar_gz(
                [
                    (
                        "manifest.json",
                        json.dumps(
                            {**json.loads(good_manifest), "run": {"name": "n" * 5000}}
                        ).encode(),
                    ),
                    ("traces/r0.json.gz", kineto),
                ]
            ),
            422,
            "run.name",
        ),
        "trace nested 2000 deep": lambda: (
            bundle_with("traces/r0.json", b'{"traceEvents": [{"args": ' + b"[" * 2000, "kineto"),
            400,
            "nested deeper",
        ),
        "trace without traceEvents": lambda: (
            bundle_with("traces/r0.json", b'{"traceEvents": 5}', "kineto"),
            400,
            "traceEvents is not a list",
        ),
        "format differs from content": lambda: (
            bundle_with("traces/r0.json.gz", kineto, "nsys"),
            422,
            "the manifest says 'nsys'",
        ),
        "gzip bomb trace": lambda: (
            bundle_with("traces/r0.json.gz", gzip_bomb(80 * 1024 * 1024), "kineto"),
            413,
            "limit",
        ),
        "gzip bomb bundle": lambda: (
            tar_gz_bomb([("manifest.json", good_manifest)], "traces/r0.json", 80 * 1024 * 1024),
            413,
            "limit",
        ),
    }


@pytest.mark.parametrize(
    ("case", "form"),
    # each case in one body form, the forms alternating: both reach the same reader
    [(case, FORMS[i % 2]) for i, case in enumerate(_bad_bundles(Path()))],
)
def test_bad_bundle_is_refused_and_nothing_stored(
    case: str,
    form: str,
    client: TestClient,
    runner: dict[str, str],
    app_env: dict[str, Any],
    tmp_path: Path,
) -> None:
    data, status, words = _bad_bundles(tmp_path)[case]()
    before = _stored(app_env)
    resp = post_bundle(client, data, runner, form)
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["ok"] is False and body["status"] == status
    assert words.lower() in body["error"].lower(), body["error"]
    assert _stored(app_env) == before


@pytest.mark.parametrize("form", FORMS)
def test_oversized_upload_is_413(
    form: str, client: TestClient, runner: dict[str, str], app_env: dict[str, Any]
) -> None:
    before = _stored(app_env)
    big = b"\x1f\x8b" + b"x" * (9 * 1024 * 1024)  # over the module's 8 MiB limit
    resp = post_bundle(client, big, runner, form)
    assert resp.status_code == 413
    assert "limit" in resp.json()["error"]
    assert _stored(app_env) == before


def test_bad_single_traces(
    client: TestClient, runner: dict[str, str], app_env: dict[str, Any], tmp_path: Path
) -> None:
    before = _stored(app_env)
    cases = [
        (gzip.compress(b"[1, 2, 3")[:-6], 400, "truncated"),
        (b'{"traceEvents": [', 400, "invalid json"),
        (sqlite_with(tmp_path, trigger=True), 422, "trigger"),
        (b"just some text", 422, "not a supported trace"),
    ]
    for data, status, words in cases:
        resp = client.post(TRACES, files={"trace": ("t", data)}, headers=runner)
        assert resp.status_code == status, (words, resp.text)
        assert words in resp.json()["error"].lower()
    bad_rank = client.post(
        TRACES,
        files={"trace": ("t", KINETO_RANK0.read_bytes())},
        data={"rank": "-1"},
        headers=runner,
    )
    assert bad_rank.status_code == 400 and "rank" in bad_rank.json()["error"]
    for rank in ("\u00b2", str(2**63), "1e3"):
        odd = client.post(
            TRACES,
            files={"trace": ("t", KINETO_RANK0.read_bytes())},
            data={"rank": rank},
            headers=runner,
        )
        assert odd.status_code == 400 and "rank" in odd.json()["error"], (rank, odd.text)
    assert (
        client.post(
            TRACES, files={"trace": ("t", b"x")}, headers=runner, params={"run_id": 999999}
        ).status_code
        == 404
    )
    assert _stored(app_env) == before


def test_wrong_idempotency_key(client: TestClient, runner: dict[str, str]) -> None:
    resp = post_bundle(client, kineto_bundle(salt="key"), {**runner, "Idempotency-Key": "0" * 64})
    assert resp.status_code == 400 and "Idempotency-Key" in resp.json()["error"]


def test_body_neither_form_nor_bundle(client: TestClient, runner: dict[str, str]) -> None:
    resp = client.post(BUNDLES, content=b"raw", headers={**runner, "Content-Type": "text/plain"})
    assert resp.status_code == 400
    assert "multipart" in resp.json()["error"] and "application/gzip" in resp.json()["error"]
    resp = client.post(
        BUNDLES, content=b"raw", headers={**runner, "Content-Type": "application/gzip"}
    )
    assert resp.status_code == 400 and "not a readable tar" in resp.json()["error"]
    resp = client.post(
        BUNDLES, content=b"", headers={**runner, "Content-Type": "application/x-tar"}
    )
    assert resp.status_code == 400 and "empty" in resp.json()["error"]
    # a single trace has a name and a rank: only the form carries them
    resp = client.post(
        TRACES, content=b"{}", headers={**runner, "Content-Type": "application/gzip"}
    )
    assert resp.status_code == 400 and "multipart" in resp.json()["error"]
    resp = client.post(BUNDLES, files={"other": ("x", b"data")}, headers=runner)
    assert resp.status_code == 400 and "'bundle'" in resp.json()["error"]
