"""Regenerate docs/cli.md from the commands' own docstrings (run: python scripts/cli_reference.py).

``tests/cli/test_cli_docs.py`` fails when the file is out of date, so the reference can't drift
from the code (the sqlite-utils cog habit, without cog).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cptrace.cli import app  # noqa: E402

HEADER = """# Command-line reference

Generated from the commands' docstrings by `python scripts/cli_reference.py`; do not edit by hand.
Every command has `--help` with its options.
"""


def iter_commands(group: typer.Typer, prefix: str = "cptrace"):
    """Yield (full name, callback) for every command, sub-groups included, in a stable order."""
    for info in group.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        yield f"{prefix} {name}", info.callback
    for sub in group.registered_groups:
        yield from iter_commands(sub.typer_instance, f"{prefix} {sub.name}")


def render() -> str:
    """The whole reference as Markdown."""
    parts = [HEADER]
    for full_name, callback in sorted(iter_commands(app)):
        doc = inspect.cleandoc(callback.__doc__ or "")
        parts.append(f"\n## `{full_name}`\n\n{doc}\n")
    return "".join(parts)


if __name__ == "__main__":
    (ROOT / "docs" / "cli.md").write_text(render(), encoding="utf-8")
