"""The ``cptrace`` command line: a thin layer over the libraries.

Each module in ``cptrace.commands`` registers its commands on the one Typer app; the command
names mirror library functions (``analyze`` -> ``analyzers.analyze``). Library exceptions become
``typer.BadParameter``/``click.ClickException`` only here, at the edge.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

import cptrace.commands

app = typer.Typer(
    name="cptrace",
    help="Find out why context-parallel attention on packed sequences is slow, and what to change.",
    no_args_is_help=True,
    add_completion=False,
    # Plain "Error: ..." lines: rich's error panel cuts long messages (file paths, URLs) short.
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """cptrace: trace analysis for context-parallel attention on packed (THD) sequences."""


def _register_commands() -> None:
    modules = sorted(pkgutil.iter_modules(cptrace.commands.__path__), key=lambda m: m.name)
    for module_info in modules:
        module = importlib.import_module(f"cptrace.commands.{module_info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def main() -> None:
    """Console-script entry point."""
    app()
