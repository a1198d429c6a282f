"""``service/storage/runs.py`` is the only module with SQL on the runs tables.

Every string literal of ``service/`` and ``web/`` (f-strings by their literal parts, adjacent
literals joined as Python joins them) is searched for a statement that names one of the runs
tables after ``FROM``/``JOIN``/``INTO``/``UPDATE``, for sqlite-utils access to them
(``db["runs"]``, ``db.table("runs")``), and for SQLAlchemy Core on them
(``schema.runs``). The schema (``service/storage/migrations.py``) creates the
tables and is not a query.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNS_TABLES = ("runs", "run_files", "run_metrics", "reports", "uploads", "comparisons")
HOME = "service/storage/runs.py"
SCHEMA = "service/storage/migrations.py"
ALLOWED: dict[str, str] = {}
_SQL = re.compile(
    r"\b(?:FROM|JOIN|INTO|UPDATE)\s+(" + "|".join(RUNS_TABLES) + r")\b"
)  # (keywords in capitals, as the code writes SQL; "FROM uploads" in prose is lower case)


def _literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value
                for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
            yield node.lineno, text
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


_TABLE_METHODS = frozenset(
    ("insert", "insert_all", "upsert", "upsert_all", "update", "delete", "delete_where",
     "rows", "rows_where", "count_where", "get", "lookup", "create_index", "add_column")
)  # fmt: skip
"""sqlite-utils ``Table`` methods: ``db["runs"].insert(...)`` is SQL on ``runs``."""


def _table_access(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``db["runs"].insert(...)`` and ``db.table("runs")``: sqlite-utils on a runs table
    (a JSON answer's ``body["runs"]`` is not)."""
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if (
            isinstance(node, ast.Attribute)
            and node.attr in _TABLE_METHODS
            and isinstance(node.value, ast.Subscript)
        ):
            key = node.value.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "table"
            and node.args
        ):
            key = node.args[0]
        if isinstance(key, ast.Constant) and key.value in RUNS_TABLES:
            yield node.lineno, str(key.value)


def _core_access(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``schema.runs`` (a Core statement on a runs table) and ``from service.storage.schema
    import runs``."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in RUNS_TABLES
            and isinstance(node.value, ast.Name)
            and node.value.id == "schema"
        ):
            yield node.lineno, node.attr
        elif isinstance(node, ast.ImportFrom) and node.module == "service.storage.schema":
            for alias in node.names:
                if alias.name in RUNS_TABLES:
                    yield node.lineno, alias.name


def runs_sql(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """``(line, table)`` for each place in ``source`` that queries a runs table."""
    tree = ast.parse(source, filename=filename)
    found = [(line, m.group(1)) for line, text in _literals(tree) for m in _SQL.finditer(text)]
    found += list(_table_access(tree))
    found += list(_core_access(tree))
    return sorted(set(found))


def _offenders() -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for package in ("service", "web"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in (HOME, SCHEMA):
                continue
            found = runs_sql(path.read_text(encoding="utf-8"), rel)
            if found:
                out[rel] = found
    return out


def test_sql_on_runs_tables_lives_in_storage_runs() -> None:
    offenders = _offenders()
    unexpected = {path: found for path, found in offenders.items() if path not in ALLOWED}
    assert not unexpected, (
        f"SQL on the runs tables outside {HOME} (use or add a function there): {unexpected}"
    )
    stale = sorted(set(ALLOWED) - set(offenders))
    assert not stale, f"no runs SQL left in {stale}: remove them from ALLOWED"


def test_the_scanner_finds_each_form() -> None:
    source = """
def f(conn, db, run_id, cols):
    conn.execute("SELECT id FROM runs WHERE id = ?", (run_id,))
    conn.execute(f"UPDATE run_files SET {cols} WHERE run_id = ?", (run_id,))
    conn.execute("SELECT count(*) FROM jobs j " "JOIN run_metrics m ON m.run_id = j.run_id")
    conn.execute("INSERT INTO uploads (key) VALUES (?)", ("k",))
    db["reports"].insert({})
    db.table("comparisons").upsert({}, pk="id")
    print("nothing from uploads here: prose, and FROM jobs is another table")
    conn.execute(sa.select(schema.comparisons.c.id))
    return resp.json()["runs"], schema.jobs
"""
    assert runs_sql(source) == [
        (3, "runs"),
        (4, "run_files"),
        (5, "run_metrics"),
        (6, "uploads"),
        (7, "reports"),
        (8, "comparisons"),
        (10, "comparisons"),
    ]
    assert runs_sql(HOME_SOURCE), "the home module itself is seen by the scanner"


HOME_SOURCE = (REPO / HOME).read_text(encoding="utf-8")
