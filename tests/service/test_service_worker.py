"""The analysis worker on real traces: reports, metrics, failures, leases; comparisons on top."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_factories import drain_worker, kineto_bundle, te_3arms_bundle

from analyzers.report import AnalysisReport
from service import analysis
from service.storage.database import connect

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first


def _upload(client: TestClient, runner: dict[str, str], data: bytes) -> int:
    resp = client.post(
        "/api/v1/uploads/bundles", files={"bundle": ("b.tar.gz", data)}, headers=runner
    )
    assert resp.status_code in (200, 201), resp.text
    return resp.json()["run_id"]


def _drain(app_env: dict[str, Any], **kw: Any) -> None:
    drain_worker(app_env["app"].state.settings, **kw)


@pytest.fixture(scope="module")
def te_run(client: TestClient, runner: dict[str, str], app_env: dict[str, Any]) -> int:
    run_id = _upload(client, runner, te_3arms_bundle())
    _drain(app_env)
    return run_id


@pytest.fixture(scope="module")
def small_run(client: TestClient, runner: dict[str, str], app_env: dict[str, Any]) -> int:
    """An analysed two-rank Kineto run of the small real traces, for the re-analysis tests:
    queueing a run again does not depend on its size, and the reference run takes seconds."""
    run_id = _upload(client, runner, kineto_bundle(salt="reanalysed"))
    _drain(app_env)
    assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "analysed"
    return run_id


def test_worker_analyses_a_real_run(client: TestClient, te_run: int) -> None:
    status = client.get(f"/api/v1/runs/{te_run}/analysis").json()
    assert status["status"] == "done", status
    assert status["duration_s"] > 0
    report = AnalysisReport.model_validate(
        client.get(f"/api/v1/runs/{te_run}/analysis/result").json()
    )
    assert report.ranks == [0, 1]
    helpers = {h.helper for h in report.helpers}
    assert "get_cu_seqlens_on_cp_rank" in helpers
    run = client.get(f"/api/v1/runs/{te_run}").json()
    assert run["status"] == "analysed" and run["progress"] == "done"
    assert "arm:auto_clone" in run["window_groups"]
    assert run["findings"] == len(report.findings)


def test_compare_two_arms_of_one_run(
    client: TestClient, runner: dict[str, str], te_run: int
) -> None:
    body = {
        "base_run_id": te_run,
        "head_run_id": te_run,
        "base_window": "arm:auto_clone",
        "head_window": "arm:explicit_false",
    }
    first = client.post("/api/v1/comparisons", json=body, headers=runner)
    assert first.status_code == 201, first.text
    record = first.json()
    assert record["verdict"] in ("faster", "slower", "no significant change")
    deltas = {d["helper"]: d for d in record["report"]["helpers"]}
    # the slow path's metadata helper disappears with pad_between_seqs=False
    assert deltas["get_cu_seqlens_on_cp_rank"]["delta_launches"] < 0
    again = client.post("/api/v1/comparisons", json=body, headers=runner)
    assert again.status_code == 200 and again.json()["id"] == record["id"]
    listed = client.get("/api/v1/comparisons", params={"run_id": te_run}).json()
    assert [c["id"] for c in listed] == [record["id"]]
    stored = client.get(f"/api/v1/comparisons/{record['id']}").json()
    assert stored["report"]["summary"] == record["report"]["summary"]


def test_compare_two_runs_and_refuse_unanalysed(
    client: TestClient, runner: dict[str, str], te_run: int
) -> None:
    pending = client.post("/api/v1/runs", json={"name": "pending"}, headers=runner).json()["id"]
    resp = client.post(
        "/api/v1/comparisons", json={"base_run_id": te_run, "head_run_id": pending}, headers=runner
    )
    assert resp.status_code == 409 and "no analysis result" in resp.json()["error"]
    resp = client.post(
        "/api/v1/comparisons", json={"base_run_id": te_run, "head_run_id": 999999}, headers=runner
    )
    assert resp.status_code == 404
    computed = client.get("/api/v1/comparisons/compute", params={"base": te_run, "head": te_run})
    assert computed.status_code == 200 and computed.json()["verdict"]


def test_unknown_window_is_a_400_on_every_comparison_route(
    client: TestClient, runner: dict[str, str], te_run: int
) -> None:
    """``CompareError`` answers 400 with the one error shape, computed or stored alike."""
    computed = client.get(
        "/api/v1/comparisons/compute",
        params={"base": te_run, "head": te_run, "base_window": "arm:nope"},
    )
    stored = client.post(
        "/api/v1/comparisons",
        json={"base_run_id": te_run, "head_run_id": te_run, "head_window": "arm:nope"},
        headers=runner,
    )
    for resp in (computed, stored):
        assert resp.status_code == 400, resp.text
        body = resp.json()
        assert body["ok"] is False and body["status"] == 400 and "arm:nope" in body["error"]


def test_history_of_a_config(client: TestClient, te_run: int) -> None:
    key = client.get(f"/api/v1/runs/{te_run}").json()["config_key"]
    points = client.get(
        "/api/v1/metrics/history",
        params={"config_key": key, "metric": "gpu_busy_ms_per_step", "label": "arm:auto_clone"},
    ).json()
    assert [p["run_id"] for p in points] == [te_run] and points[0]["value"] > 0


def test_bad_trace_fails_the_run_with_the_reason(
    client: TestClient, runner: dict[str, str], app_env: dict[str, Any]
) -> None:
    # a trace without traceEvents is refused at upload (the structural check)...
    for text in (b'{"foo": 1}', b"{}", b'{"traceEvents": 5}'):
        refused = client.post(
            "/api/v1/uploads/traces", files={"trace": ("bad.json", text)}, headers=runner
        )
        assert refused.status_code == 400 and "traceEvents" in refused.json()["error"], text
    # ...an empty event list passes it; the Kineto reader then finds no events
    resp = client.post(
        "/api/v1/uploads/traces",
        files={"trace": ("empty.json", b'{"traceEvents": []}')},
        headers=runner,
    )
    run_id = resp.json()["run_id"]
    _drain(app_env)
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "failed" and run["error"]
    status = client.get(f"/api/v1/runs/{run_id}/analysis").json()
    assert status["status"] == "failed" and status["error"] == run["error"]
    result = client.get(f"/api/v1/runs/{run_id}/analysis/result")
    assert result.status_code == 409 and run["error"] in result.json()["error"]


def test_a_saved_report_uploads_like_a_trace(
    client: TestClient, runner: dict[str, str], app_env: dict[str, Any], te_run: int
) -> None:
    """A saved ``cptrace analyze --json`` report is accepted where a trace is (by content)."""
    saved = client.get(f"/api/v1/runs/{te_run}/analysis/result").content
    resp = client.post(
        "/api/v1/uploads/traces", files={"trace": ("saved.bin", saved)}, headers=runner
    )
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["run_id"]
    _drain(app_env)
    result = client.get(f"/api/v1/runs/{run_id}/analysis/result")
    assert result.status_code == 200, result.text
    assert result.json() == client.get(f"/api/v1/runs/{te_run}/analysis/result").json()


def test_reanalyse_and_progress(
    client: TestClient, admin: dict[str, str], app_env: dict[str, Any], small_run: int
) -> None:
    resp = client.post(f"/api/v1/runs/{small_run}/analysis", headers=admin)
    assert resp.status_code == 202 and resp.json()["status"] == "queued"
    seen: list[str] = []

    def slow_analyze(paths: list[Path], *, manifest: Any, progress: Any) -> AnalysisReport:
        from analyzers import analyze

        progress("reading", 0.1)
        time.sleep(0.6)  # the heartbeat thread publishes the progress meanwhile
        seen.append(client.get(f"/api/v1/runs/{small_run}").json()["progress"])
        return analyze(paths, manifest=manifest, progress=progress)

    _drain(app_env, analyze=slow_analyze)
    assert seen and "reading" in seen[0]
    assert client.get(f"/api/v1/runs/{small_run}").json()["status"] == "analysed"


def test_old_reports_are_reanalysed(
    client: TestClient, app_env: dict[str, Any], small_run: int
) -> None:
    db = app_env["db"]
    db.write_tx(
        lambda c: c.execute("UPDATE reports SET schema_version = 0 WHERE run_id = ?", (small_run,))
    )
    assert db.write(analysis.requeue_stale_reports) == [small_run]
    assert db.write(analysis.requeue_stale_reports) == []  # already queued
    _drain(app_env)
    assert client.get(f"/api/v1/runs/{small_run}/analysis").json()["status"] == "done"
    assert db.write(analysis.requeue_stale_reports) == []


def test_killed_worker_lease_requeues_then_gives_up(
    client: TestClient, runner: dict[str, str], app_env: dict[str, Any]
) -> None:
    run_id = _upload(client, runner, kineto_bundle(salt="lease"))
    settings = app_env["app"].state.settings
    conn = connect(settings.db_path, busy_timeout_ms=5000)
    try:
        for attempt in (1, 2):  # a worker claims, then "dies" (never finishes)
            task = analysis.claim_analysis(
                conn, worker=f"dead{attempt}", lease_s=0.05, max_attempts=2
            )
            assert task is not None and task.run_id == run_id and task.attempt == attempt
            time.sleep(0.1)
        assert analysis.claim_analysis(conn, worker="x", lease_s=60, max_attempts=2) is None
    finally:
        conn.close()
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "failed" and "lost its lease" in run["error"]
