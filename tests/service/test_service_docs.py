"""docs/service.md stays in sync with the code: settings, routes, commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cptrace.cli import app
from service.core.config import Settings

DOC = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()


@pytest.mark.parametrize("field", sorted(Settings.model_fields))
def test_every_setting_is_documented(field: str) -> None:
    row = re.search(rf"^\| `CPTRACE_{field.upper()}` \| `([^`]*)` \| (.+) \|$", DOC, re.MULTILINE)
    assert row, f"CPTRACE_{field.upper()} is missing from the settings table of docs/service.md"
    info = Settings.model_fields[field]
    if info.default_factory is not None:  # a default computed from the host, said in words
        extra = info.json_schema_extra
        assert isinstance(extra, dict), f"{field}: a computed default needs its words"
        assert row.group(1) == extra["documented_default"], f"{field}: documented default"
        return
    default = info.default
    shown = str(default).lower() if isinstance(default, bool) else str(default)
    assert row.group(1) in (shown, shown.removesuffix(".0")), f"{field}: documented default"


def test_documented_settings_exist() -> None:
    documented = set(re.findall(r"^\| `CPTRACE_([A-Z0-9_]+)` \|", DOC, re.MULTILINE))
    assert documented == {f.upper() for f in Settings.model_fields}


def test_every_route_is_documented(tmp_path: Path) -> None:
    from cptrace.app import create_app

    app_ = create_app(Settings(data_dir=tmp_path, ingest_workers=0))
    try:
        paths = app_.openapi()["paths"]
    finally:
        app_.state.db.close()
    ours = [
        p
        for p, item in paths.items()
        if p.startswith("/api/v1")
        and all("pages" not in op.get("tags", ()) for op in item.values())
    ]
    assert len(ours) > 15
    for path in ours:
        bare = re.sub(r"\{[a-z_]+\}", "{id}", path.removeprefix("/api/v1"))
        assert bare in DOC, f"{path} is not in docs/service.md"


@pytest.mark.parametrize("command", [["serve"], ["worker"], ["token", "create"]])
def test_commands_have_help_with_an_example(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output
    assert f"cptrace {' '.join(command)}" in DOC


def test_token_create_prints_a_working_token(tmp_path: Path) -> None:
    from service.auth import Role, lookup_token
    from service.main import open_database

    result = CliRunner().invoke(
        app, ["token", "create", "--role", "viewer", "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    token = result.output.strip()
    db = open_database(Settings(data_dir=tmp_path))
    try:
        assert db.read(lambda c: lookup_token(c, token)) == Role.VIEWER
        stored = db.read(lambda c: c.execute("SELECT token_hash FROM tokens").fetchone()[0])
        assert token not in stored  # only the hash is kept
    finally:
        db.close()
    bad = CliRunner().invoke(
        app, ["token", "create", "--role", "root", "--data-dir", str(tmp_path)]
    )
    assert bad.exit_code != 0 and "admin, runner, ci, viewer" in bad.output
