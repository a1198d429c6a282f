"""``cptrace version``."""

from __future__ import annotations

import typer

from cptrace import __version__


def version() -> None:
    """Print the cptrace version.

    Example: cptrace version
    """
    typer.echo(f"cptrace {__version__}")


def register(app: typer.Typer) -> None:
    app.command("version")(version)
