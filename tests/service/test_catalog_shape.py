"""One catalog shape: ``GET /api/v1/catalog``, the page's twin ``/catalog.json`` and ``cptrace
catalog --json`` give the same ``CatalogDescription``, with no private matcher field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from analyzers.catalog import load_catalog
from analyzers.catalog.description import CatalogDescription
from cptrace.app import create_app
from cptrace.cli import app as cli_app
from service.core.config import Settings


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_the_api_the_page_twin_and_the_cli_give_one_shape(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data", ingest_workers=0, public_read=True))
    with TestClient(app) as client:
        api = client.get("/api/v1/catalog")
        twin = client.get("/catalog.json")
    assert api.status_code == 200 and twin.status_code == 200, (api.text, twin.text)
    printed = CliRunner().invoke(cli_app, ["catalog", "--json"])
    assert printed.exit_code == 0, printed.output
    cli = json.loads(printed.output)
    assert api.json() == twin.json() == cli
    described = CatalogDescription.model_validate(cli)  # extra="forbid": no field outside it
    assert {h.name for h in described.helpers} == {h.name for h in load_catalog().helpers}
    assert not [k for k in _keys(cli) if k.startswith("_")]  # the matchers stay private
    schema = client.app.openapi()["paths"]["/api/v1/catalog"]["get"]["responses"]["200"]
    assert schema["content"]["application/json"]["schema"]["$ref"].endswith("CatalogDescription")
