"""All SQL lives in ``service/storage/`` (read from the source, like ``test_import_rules``).

Outside that package no module of the store's users (the service, the pages, the PR bot, the
CLI) runs a statement: no ``.execute`` / ``.executemany`` / ``.executescript`` call, no
``sqlalchemy`` or ``sqlite_utils`` import, no use of the SQLite helpers that take SQL text
(``service.storage.database.rows`` / ``one`` / ``Database.read_db``), and no string that is a
statement (``SELECT ... FROM``, ``INSERT INTO``, ``UPDATE ... SET``, ``DELETE FROM``, ``PRAGMA``,
DDL). So every statement is one the storage modules run on both backends.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USERS = ("service", "web", "pr_bot", "cptrace")
STORAGE = REPO / "service" / "storage"
CALLS = frozenset({"execute", "executemany", "executescript", "read_db"})
IMPORTS = ("sqlalchemy", "sqlite_utils")
SQL_HELPERS = frozenset({"rows", "one"})
STATEMENT = re.compile(
    r"^\s*(SELECT\b.*\bFROM\b|INSERT\s+(OR\s+\w+\s+)?INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b"
    r"|PRAGMA\s+\w+|(CREATE|DROP|ALTER)\s+(TABLE|INDEX|VIEW|TRIGGER)\b|BEGIN\s+IMMEDIATE\b)",
    re.DOTALL,
)


MARKERS = re.compile(
    r"execute|read_db|sqlalchemy|sqlite_utils|storage\.database|SELECT|INSERT|UPDATE|DELETE"
    r"|PRAGMA|CREATE|DROP|ALTER|BEGIN"
)
"""Every finding below contains one of these: a file without any is not parsed (cheap)."""


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def sql_uses(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """``(line, what)`` for every statement or statement runner in ``source``."""
    if not MARKERS.search(source):
        return
    tree = ast.parse(source, filename=filename)
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in CALLS:
                yield node.lineno, f".{node.func.attr}(...)"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in IMPORTS:
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in IMPORTS:
                yield node.lineno, f"from {module} import"
            if module == "service.storage.database":
                for alias in node.names:
                    if alias.name in SQL_HELPERS:
                        yield node.lineno, f"from {module} import {alias.name}"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and STATEMENT.match(node.value)
        ):
            yield node.lineno, f"SQL text {node.value[:40]!r}"


def _user_modules() -> Iterator[Path]:
    for package in USERS:
        for path in sorted((REPO / package).rglob("*.py")):
            if STORAGE not in path.parents:
                yield path


def test_no_sql_outside_storage() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in _user_modules()
        for line, what in sql_uses(path.read_text(encoding="utf-8"), str(path))
    ]
    assert not found, "SQL outside service/storage/:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "conn.execute('x')",
        "def f(c):\n    return c.cursor().executemany(q, [])\n",
        "import sqlalchemy as sa",
        "from sqlalchemy.dialects import sqlite",
        "from service.storage.database import Database, rows",
        "db.read(lambda c: c.read_db())",
        "q = 'SELECT id FROM pr_batches WHERE id = ?'",
        "q = f'UPDATE pr_batches SET {sets} WHERE id = ?'",
        "q = ('INSERT OR IGNORE INTO t (a)' ' VALUES (?)')",
        "def f():\n    x = 1\n    'DELETE FROM t'\n",
    ],
)
def test_the_scanner_sees_sql(source: str) -> None:
    assert list(sql_uses(source)), source


@pytest.mark.parametrize(
    "source",
    [
        '"""SELECT the newest run FROM the list: a docstring."""',
        "def f():\n    '''DELETE FROM t, says the docstring'''\n",
        "msg = 'select a run from the list'",
        "from service.storage.database import Database, immediate",
        "pool.submit(fn)",
    ],
)
def test_the_scanner_leaves_prose_alone(source: str) -> None:
    assert not list(sql_uses(source)), source
