"""docker-compose.yml and Dockerfile, checked without Docker: schema, references, real commands."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
import yaml

from cptrace.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()
SERVICES: dict[str, Any] = COMPOSE["services"]
THIRD_PARTY = {"minio": "minio/minio:", "postgres": "postgres:"}
"""Services that run an upstream image (not built from the Dockerfile)."""


def test_services_and_images() -> None:
    assert set(SERVICES) == {"api", "worker", "runner", "minio", "postgres"}
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", DOCKERFILE, re.MULTILINE | re.IGNORECASE))
    images = {}
    for name, service in SERVICES.items():
        build = service.get("build")
        if build:
            assert build["context"] == "."
            assert build["target"] in stages, f"{name}: no Dockerfile stage {build['target']!r}"
            images[service["image"]] = build["target"]
    for name, service in SERVICES.items():
        if name in THIRD_PARTY:
            assert "build" not in service and service["image"].startswith(THIRD_PARTY[name])
            continue
        assert "build" in service or service["image"] in images, f"{name}: image is never built"
    assert images[SERVICES["worker"]["image"]] == "service"


def test_dockerfile_copies_existing_paths() -> None:
    for line in re.findall(r"^COPY\s+(.+)$", DOCKERFILE, re.MULTILINE):
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"


def test_named_volume_shared_by_api_and_worker() -> None:
    declared = set(COMPOSE["volumes"])
    mounts: dict[str, dict[str, str]] = {}
    for name, service in SERVICES.items():
        for spec in service.get("volumes", []):
            volume, target = spec.split(":")[:2]
            assert volume in declared, f"{name}: volume {volume!r} is not declared"
            mounts.setdefault(name, {})[volume] = target
    assert mounts["api"]["cptrace-data"] == mounts["worker"]["cptrace-data"] == "/data"
    for name in ("api", "worker"):
        command = SERVICES[name]["command"]
        assert command[command.index("--data-dir") + 1] == "/data"  # the DB lives in the volume


def test_healthchecks_and_dependencies() -> None:
    for name, service in SERVICES.items():
        check = service["healthcheck"]
        assert check["test"][0] == "CMD" and len(check["test"]) > 1, name
        for key in ("interval", "timeout"):
            assert re.fullmatch(r"\d+(ms|s|m)", check[key]), (name, key)
        assert int(check["retries"]) >= 1
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in SERVICES
            assert condition["condition"] in ("service_healthy", "service_started")
    assert SERVICES["worker"]["depends_on"]["api"]["condition"] == "service_healthy"
    health = SERVICES["api"]["healthcheck"]["test"][-1]
    assert "/api/v1/health" in health


def test_runner_reserves_nvidia_gpus() -> None:
    devices = SERVICES["runner"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices and devices[0]["driver"] == "nvidia"
    assert devices[0]["capabilities"] == ["gpu"]
    assert "deploy" not in SERVICES["api"] and "deploy" not in SERVICES["worker"]
    assert "http://api:8000" in SERVICES["runner"]["command"]


def test_minio_profile_wires_s3_blobs(tmp_path: Path) -> None:
    """``--profile s3 --env-file compose.s3.env``: API and workers share the minio bucket."""
    from service.core.config import Settings
    from service.storage.blobs import S3Location

    minio = SERVICES["minio"]
    assert minio["profiles"] == ["s3"] and minio["image"].startswith("minio/minio")
    assert SERVICES["api"]["depends_on"]["minio"]["required"] is False  # optional without s3
    assert SERVICES["api"]["environment"] == SERVICES["worker"]["environment"]
    env_file = _env_file("compose.s3.env")
    wired = re.findall(r"\$\{(\w+):-", yaml.safe_dump(SERVICES["api"]["environment"]))
    assert set(env_file) | {"CPTRACE_DATABASE_URL"} == set(wired)
    endpoint = env_file["CPTRACE_S3_ENDPOINT_URL"]
    assert endpoint == "http://minio:9000"  # the service name, MinIO's S3 port
    settings = Settings(
        data_dir=tmp_path, blobs=env_file["CPTRACE_BLOBS"], s3_endpoint_url=endpoint
    )
    assert isinstance(settings.blob_location, S3Location)
    assert "--scale worker" in (ROOT / "docker-compose.yml").read_text()


def _env_file(name: str) -> dict[str, str]:
    lines = (ROOT / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_postgres_profile_wires_the_database(tmp_path: Path) -> None:
    """``--profile postgres --env-file compose.postgres.env``: API and workers share the
    postgres service's database, with the user, password and name that service creates."""
    from service.core.config import Settings
    from service.storage.engine import Backend, backend_of

    postgres = SERVICES["postgres"]
    assert postgres["profiles"] == ["postgres"]
    assert SERVICES["api"]["depends_on"]["postgres"]["required"] is False
    env_file = _env_file("compose.postgres.env")
    url = sa.make_url(env_file["CPTRACE_DATABASE_URL"])
    assert backend_of(str(env_file["CPTRACE_DATABASE_URL"])) is Backend.POSTGRESQL
    made = postgres["environment"]
    assert (url.host, url.port, url.username, url.database) == (
        "postgres", 5432, made["POSTGRES_USER"], made["POSTGRES_DB"]
    )  # fmt: skip
    password = re.fullmatch(r"\$\{CPTRACE_POSTGRES_PASSWORD:-(.*)\}", made["POSTGRES_PASSWORD"])
    assert password and url.password == env_file["CPTRACE_POSTGRES_PASSWORD"] == password.group(1)
    wired = yaml.safe_dump(SERVICES["worker"]["environment"])
    assert "CPTRACE_DATABASE_URL: ${CPTRACE_DATABASE_URL:-}" in wired
    Settings(data_dir=tmp_path, database_url=env_file["CPTRACE_DATABASE_URL"])


@pytest.mark.parametrize("name", ["api", "worker", "runner"])
def test_commands_are_real_cli_commands(name: str) -> None:
    """Parse each command with the real Typer app, so a renamed option fails here."""
    command = SERVICES[name]["command"]
    assert command[0] == "cptrace"
    group = typer.main.get_command(app)
    with group.make_context("cptrace", list(command[1:]), resilient_parsing=False) as ctx:
        sub = group.get_command(ctx, command[1])
        assert sub is not None, f"{name}: no cptrace command {command[1]!r}"
        sub.make_context(command[1], list(command[2:]), parent=ctx)
    dockerfile_cmds = re.findall(r"^CMD\s+(\[.+\])$", DOCKERFILE, re.MULTILINE)
    for raw in dockerfile_cmds:
        assert yaml.safe_load(raw)[0] == "cptrace"
