"""``/health`` is readiness per component: each component's failure answers 503 on its own."""

from __future__ import annotations

from pathlib import Path

from conftest import make_settings
from fastapi.testclient import TestClient

from service.main import create_app
from service.supervisor import RestartBudget


def _health(tmp_path: Path, **overrides: object) -> tuple[int, dict]:  # type: ignore[type-arg]
    settings = make_settings(tmp_path).model_copy(update=overrides)
    app = create_app(settings)
    with TestClient(app) as client:
        resp = client.get("/api/v1/health")
        assert client.get("/api/v1/health/live").json()["ok"] is True
        return resp.status_code, resp.json()


def test_all_components_up(tmp_path: Path) -> None:
    status, body = _health(tmp_path)
    assert status == 200 and body["ok"] is True and body["down"] == []
    assert set(body["components"]) == {"database", "worker", "validation", "queue", "disk"}
    assert body["components"]["worker"]["state"] == "external"  # no supervised worker here


def test_disk_nearly_full_is_503(tmp_path: Path) -> None:
    status, body = _health(tmp_path, health_min_free_bytes=1 << 62)
    assert status == 503 and body["down"] == ["disk"]


def test_a_stalled_queue_is_503(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, health_queue_stall_s=60))
    app.state.db.write_tx(
        lambda c: c.execute(
            "INSERT INTO runs (name, source, status, created_at) VALUES ('r', 'api', 'queued', "
            "'2020-01-01T00:00:00+00:00')"
        )
    )
    app.state.db.write_tx(
        lambda c: c.execute(
            "INSERT INTO analysis_tasks (run_id, status, attempts, created_at) "
            "VALUES (1, 'queued', 0, '2020-01-01T00:00:00+00:00')"
        )
    )
    with TestClient(app) as client:
        resp = client.get("/api/v1/health")
    assert resp.status_code == 503 and resp.json()["down"] == ["queue"]
    assert resp.json()["components"]["queue"]["oldest_queued_age_s"] > 3600


def test_validation_pool_processes_are_reported(tmp_path: Path) -> None:
    status, body = _health(tmp_path, ingest_workers=2)
    assert status == 200
    assert body["components"]["validation"] | {"restarts": 0} == {
        "status": "ok",
        "state": "ok",
        "processes": 2,
        "alive": 2,
        "restarts": 0,
        "last_exit": None,
    }


def test_restart_budget_backs_off_then_gives_up() -> None:
    budget = RestartBudget(max_restarts=3, window_s=60, backoff_s=1)
    assert [budget.next_delay(now=t) for t in (0, 1, 2)] == [1, 2, 4]
    assert budget.next_delay(now=3) is None  # a 4th death inside the window
    fresh = RestartBudget(max_restarts=1, window_s=10, backoff_s=1)
    assert fresh.next_delay(now=0) == 1
    assert fresh.next_delay(now=20) == 1  # the first death left the window
