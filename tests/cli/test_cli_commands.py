"""The console script builds the app of the invoked command alone (``cptrace.cli.app_for``):
the map from command to module stays what the modules register, and the lean app runs a
command as the whole app does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

from cptrace.cli import COMMAND_MODULES, app, app_for, build_app

ROOT = Path(__file__).resolve().parents[2]


def _names(app: typer.Typer) -> set[str]:
    commands = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback}
    return commands | {g.name for g in app.registered_groups if g.name}


def test_the_map_names_every_command_of_the_whole_app_and_nothing_else() -> None:
    assert _names(app) == set(COMMAND_MODULES)


def test_each_module_registers_exactly_the_commands_the_map_gives_it() -> None:
    for module in set(COMMAND_MODULES.values()):
        expected = {name for name, owner in COMMAND_MODULES.items() if owner == module}
        assert _names(build_app([module])) == expected, module


def test_a_name_outside_the_map_gets_the_whole_app() -> None:
    assert app_for([]) is app
    assert app_for(["--help"]) is app
    assert app_for(["no-such-command"]) is app
    assert _names(app_for(["analyze"])) == {"analyze", "compare", "catalog"}


def test_building_apps_again_registers_no_command_twice() -> None:
    for _ in range(2):
        for module in set(COMMAND_MODULES.values()):
            build_app([module])
    for group in build_app().registered_groups:
        assert group.typer_instance is not None
        names = [c.name for c in group.typer_instance.registered_commands]
        assert len(names) == len(set(names)), (group.name, names)
    assert sorted(_names(next(g.typer_instance for g in app.registered_groups
                              if g.name == "token" and g.typer_instance))) == [
        "create", "list", "revoke"]  # fmt: skip


def _script(*argv: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from cptrace.cli import main; sys.argv[0] = 'cptrace'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_the_console_script_imports_only_the_invoked_commands_module() -> None:
    probe = (
        "import sys; from cptrace.cli import main; sys.argv = ['cptrace', 'version']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('cptrace.commands.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['cptrace.commands.version']"


def test_help_usage_errors_and_a_group_read_as_with_the_whole_app() -> None:
    listing = _script("--help")
    assert listing.returncode == 0
    for name in COMMAND_MODULES:
        assert f"  {name} " in listing.stdout, name
    unknown = _script("no-such-command")
    assert unknown.returncode == 2
    assert "No such command 'no-such-command'" in unknown.stderr
    group = _script("bundle", "--help")
    assert group.returncode == 0
    assert "check" in group.stdout and "pack" in group.stdout
    bad = _script("analyze", "--format", "xml", "x.json")
    assert bad.returncode == 2
    assert "--format" in bad.stderr
