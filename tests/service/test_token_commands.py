"""`cptrace token create | list | revoke` against a real database file."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cptrace.cli import app
from service.auth import lookup_token
from service.core.config import Settings
from service.main import open_database


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_create_list_revoke(tmp_path: Path) -> None:
    made = _cli(
        "token", "create", "--role", "runner", "--name", "gpu-1", "--data-dir", str(tmp_path)
    )
    assert made.exit_code == 0, made.output
    secret = made.output.strip()
    listed = _cli("token", "list", "--data-dir", str(tmp_path))
    assert listed.exit_code == 0 and "runner\tgpu-1" in listed.output
    assert secret not in listed.output  # never shown again
    token_id = listed.output.split("\t", 1)[0]

    revoked = _cli("token", "revoke", token_id, "--data-dir", str(tmp_path))
    assert revoked.exit_code == 0 and f"revoked token {token_id}" in revoked.output
    db = open_database(Settings(data_dir=tmp_path))
    try:
        assert db.read(lambda c: lookup_token(c, secret)) is None
    finally:
        db.close()


def test_revoking_an_unknown_token_is_a_clean_error(tmp_path: Path) -> None:
    result = _cli("token", "revoke", "999", "--data-dir", str(tmp_path))
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)
    assert "no token with id 999" in result.output
