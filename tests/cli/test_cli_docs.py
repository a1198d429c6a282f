"""Every command has help with an example, and docs/cli.md is generated from the code."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import script_module
from typer.testing import CliRunner

from cptrace.cli import app

ROOT = Path(__file__).resolve().parents[2]
cli_reference = script_module(ROOT / "scripts/cli_reference.py")

COMMANDS = sorted(cli_reference.iter_commands(app))


def test_every_command_is_registered() -> None:
    names = {name for name, _ in COMMANDS}
    for expected in ("analyze", "compare", "run", "upload", "agent", "serve", "worker",
                     "pr-comment", "version"):
        assert f"cptrace {expected}" in names


@pytest.mark.parametrize(("name", "callback"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_command_has_help_and_example(name: str, callback: object) -> None:
    doc = getattr(callback, "__doc__", None) or ""
    assert doc.strip(), f"{name} has no docstring (its --help would be empty)"
    assert "Example:" in doc, f"{name}'s docstring has no 'Example:' line"
    result = CliRunner().invoke(app, [*name.split()[1:], "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_cli_reference_is_up_to_date() -> None:
    current = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert current == cli_reference.render(), "run: python scripts/cli_reference.py"


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", str(ROOT / "no-such-trace.json")],
        ["pr-comment", "--base", "1", "--head", "2", "--server", "http://127.0.0.1:9"],
    ],
    ids=["analyze-missing-file", "pr-comment-unreachable-server"],
)
def test_library_error_exits_cleanly(args: list[str]) -> None:
    """A library error ends the command with status 1 and a message, not an uncaught exception."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Error" in result.output or "error" in result.output
