"""The ``cptrace`` command line: a thin layer over the libraries.

Each module in ``cptrace.commands`` registers its commands on the one Typer app; the command
names mirror library functions (``analyze`` -> ``analyzers.analyze``). Library exceptions become
``typer.BadParameter``/``click.ClickException`` only here, at the edge.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pkgutil
import sys
import threading
from typing import NoReturn

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
    """Run the app; returns (or raises ``SystemExit``) like any Typer app, for in-process
    callers."""
    app()


def console_main() -> NoReturn:
    """Console-script entry point: ``main``, then the exit without the interpreter's teardown.

    Why: freeing every object of a finished analysis one by one (the trace's arrays, the
    report's models, pydantic's schemas, every module's globals) is work nobody waits for: on
    the two-rank TE Kineto pair it was about 15% of ``cptrace analyze``'s CPU time. After the
    command, the exit handlers run (``atexit``: temporary folders, logging), stdout and stderr
    are flushed, and the process ends with the command's status. When another thread is still
    alive, or a flush fails (a closed pipe), the ordinary exit happens instead: the
    interpreter joins those threads and reports the broken pipe as it always does.
    """
    try:
        main()
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    else:
        code = 0
    exit_now(code)


def exit_now(code: object) -> NoReturn:
    """End the process with ``code`` as ``console_main`` does (exit handlers, flushes, no
    teardown; the ordinary exit with another thread alive, a failed flush or a status that is
    not a number)."""
    if not isinstance(code, int) or threading.active_count() > 1:
        raise SystemExit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(code) from None
    os._exit(code)
