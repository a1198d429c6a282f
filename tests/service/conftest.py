"""Service fixtures: a real SQLite file per module, a module-scoped TestClient, role tokens; a
real S3-compatible server (moto's) and a real PostgreSQL server per session, a blob store on
either backend, and a queue database on either backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from postgres_server import PostgresServer, postgres_missing, running_postgres
from queue_store import QueueStore
from s3_server import CREDENTIALS, moto_server, new_bucket_name
from service_factories import auth

from service.auth import Role, create_token
from service.core.config import Settings
from service.main import create_app
from service.storage.blobs import Blobs, BlobStore, S3BlobStore, S3Location
from service.storage.engine import Backend


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


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoint URL of a moto S3 server, started once per test process."""
    with moto_server(tmp_path_factory.mktemp("moto")) as url:
        yield url


@pytest.fixture
def s3_location(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3Location:
    """A fresh bucket (created by the store's ``check``) and boto3's credentials."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return S3Location(new_bucket_name(), "cptrace/", s3_endpoint)


@pytest.fixture(params=["local", "s3"])
def any_blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Blobs:
    """The same blob-store tests on both backends."""
    if request.param == "local":
        return BlobStore(tmp_path / "blobs", tmp_path / "tmp")
    store = S3BlobStore(request.getfixturevalue("s3_location"), tmp_path / "tmp")
    store.check()
    return store


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (skipped, with the reason, where none can run)."""
    missing = postgres_missing()
    if missing is not None:
        pytest.skip(missing)
    with running_postgres() as server:
        yield server


@pytest.fixture(params=[Backend.SQLITE, Backend.POSTGRESQL], ids=str)
def queue_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[QueueStore]:
    """A fresh database with the schema, on SQLite (a file) and on PostgreSQL (a database
    copied from the session server's template)."""
    if request.param is Backend.SQLITE:
        store = QueueStore(Backend.SQLITE, str(tmp_path / "queue.db"))
    else:
        store = QueueStore(Backend.POSTGRESQL, request.getfixturevalue("postgres").new_database())
    yield store
    store.close()
