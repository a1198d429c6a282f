"""The ``cptrace`` command line: a thin layer over the libraries.

Each module in ``cptrace.commands`` registers its commands on the Typer app (``build_app``;
the console script builds it with the invoked command's module only); the command names mirror
library functions (``analyze`` -> ``analyzers.analyze``). Library exceptions become
``typer.BadParameter``/``click.ClickException`` only here, at the edge.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pkgutil
import sys
import threading
from collections.abc import Sequence
from functools import cache
from typing import NoReturn

import typer

import cptrace.commands

COMMAND_MODULES: dict[str, str] = {
    "agent": "runners",
    "analyze": "analyze",
    "bundle": "runners",
    "catalog": "analyze",
    "compare": "analyze",
    "export": "export",
    "pr-comment": "web",
    "profile": "profile",
    "run": "runners",
    "screenshots": "web",
    "serve": "service",
    "token": "service",
    "upload": "runners",
    "version": "version",
    "worker": "service",
}
"""Top-level command (or group) -> the module of ``cptrace.commands`` that registers it.

Why: building the app of every command costs the command modules' imports and Typer's
work on every command's parameters, about 0.012 s CPU of each invocation, for 18 commands of
which one runs. The console script registers only the named command's module; a name not in
this map (``--help``, a typo, a module without an entry) gets the app of every command, so a
missing entry costs time, never a command (``tests/cli/test_cli_commands.py`` keeps the map
equal to what the modules register)."""


def _root() -> None:
    """cptrace: trace analysis for context-parallel attention on packed (THD) sequences."""


def build_app(modules: Sequence[str] | None = None) -> typer.Typer:
    """The Typer app with the commands of ``modules`` (names in ``cptrace.commands``; default:
    every module there)."""
    app = typer.Typer(
        name="cptrace",
        help="Find out why context-parallel attention on packed sequences is slow, and what "
        "to change.",
        no_args_is_help=True,
        add_completion=False,
        # Plain "Error: ..." lines: rich's error panel cuts long messages (file paths, URLs)
        # short.
        rich_markup_mode=None,
    )
    app.callback()(_root)
    if modules is None:
        found = pkgutil.iter_modules(cptrace.commands.__path__)
        modules = sorted(m.name for m in found)
    for name in modules:
        module = importlib.import_module(f"cptrace.commands.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)
    return app


@cache
def _full_app() -> typer.Typer:
    return build_app()


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The app that runs ``argv`` (the arguments after the program name): the named
    command's module alone when :data:`COMMAND_MODULES` knows it, else every command."""
    module = COMMAND_MODULES.get(argv[0]) if argv else None
    return _full_app() if module is None else build_app([module])


def __getattr__(name: str) -> typer.Typer:
    # ``from cptrace.cli import app``: every command (the docs, the tests, in-process callers)
    if name == "app":
        return _full_app()
    raise AttributeError(f"module 'cptrace.cli' has no attribute {name!r}")


def main() -> None:
    """Run the command of ``sys.argv``; returns (or raises ``SystemExit``) like any Typer app,
    for in-process callers."""
    app_for(sys.argv[1:])()


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
