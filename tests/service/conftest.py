"""Service fixtures: a real SQLite file per module, a module-scoped TestClient, role tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_factories import auth

from service.auth import Role, create_token
from service.core.config import Settings
from service.main import create_app


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for tests: uploads validated in a thread (no process spawn per module)."""
    return Settings(data_dir=data_dir, ingest_workers=0, **overrides)


@pytest.fixture(scope="module")
def app_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data_dir = tmp_path_factory.mktemp("service")
    app = create_app(
        make_settings(
            data_dir, max_upload_bytes=8 * 1024 * 1024, max_decompressed_bytes=64 * 1024 * 1024
        )
    )
    db = app.state.db
    tokens = {role.value: db.write_tx(lambda c, r=role: create_token(c, role=r)) for role in Role}
    with TestClient(app) as client:
        yield {"app": app, "client": client, "tokens": tokens, "db": db, "data_dir": data_dir}


@pytest.fixture(scope="module")
def client(app_env: dict[str, Any]) -> TestClient:
    return app_env["client"]


@pytest.fixture(scope="module")
def admin(app_env: dict[str, Any]) -> dict[str, str]:
    return auth(app_env["tokens"]["admin"])


@pytest.fixture(scope="module")
def runner(app_env: dict[str, Any]) -> dict[str, str]:
    return auth(app_env["tokens"]["runner"])


@pytest.fixture(scope="module")
def viewer(app_env: dict[str, Any]) -> dict[str, str]:
    return auth(app_env["tokens"]["viewer"])
