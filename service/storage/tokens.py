"""Every statement on ``tokens``, on either backend. What a token may do, how its secret is
made and checked, is ``service.auth``; this module only stores and finds rows (by the secret's
hash: the secret itself is never stored)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from service.storage import schema
from service.storage.engine import Conn, execute

_t = schema.tokens


def insert_token(
    conn: Conn,
    *,
    name: str,
    role: str,
    token_hash: str,
    created_at: str,
    runner: str | None,
    repo: str | None,
) -> int:
    """Store a token row; returns its id."""
    insert = sa.insert(_t).values(
        name=name, role=role, token_hash=token_hash, created_at=created_at, runner=runner,
        repo=repo,
    )  # fmt: skip
    return int(execute(conn, insert.returning(_t.c.id)).scalar())


def token_by_hash(conn: Conn, token_hash: str) -> dict[str, Any] | None:
    """``id, role, runner, repo`` of the token with this hash, or None."""
    query = sa.select(_t.c.id, _t.c.role, _t.c.runner, _t.c.repo)
    return execute(conn, query.where(_t.c.token_hash == token_hash)).first()


def runner_owner(conn: Conn, runner: str, *, other_than: int) -> int | None:
    """The id of a token other than ``other_than`` bound to runner name ``runner``, or None."""
    query = sa.select(_t.c.id).where(_t.c.runner == runner, _t.c.id != other_than)
    found = execute(conn, query).scalar()
    return None if found is None else int(found)


def bind_runner_name(conn: Conn, token_id: int, runner: str) -> None:
    """Bind an unbound token to runner name ``runner`` (a bound one keeps its name)."""
    update = sa.update(_t).where(_t.c.id == token_id, _t.c.runner.is_(None))
    execute(conn, update.values(runner=runner))


def count_tokens(conn: Conn, role: str | None = None) -> int:
    """How many tokens exist (of one role)."""
    query = sa.select(sa.func.count()).select_from(_t)
    if role is not None:
        query = query.where(_t.c.role == role)
    return int(execute(conn, query).scalar())


def all_tokens(conn: Conn) -> list[dict[str, Any]]:
    """Every token's id, name, role, creation time, runner and repository (never its hash)."""
    c = _t.c
    query = sa.select(c.id, c.name, c.role, c.created_at, c.runner, c.repo).order_by(c.id)
    return execute(conn, query).rows


def delete_token(conn: Conn, token_id: int) -> bool:
    """Delete a token; True when it existed."""
    return execute(conn, sa.delete(_t).where(_t.c.id == token_id)).rowcount > 0
