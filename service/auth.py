"""Bearer tokens: random secrets shown once, stored only as their sha256; four roles.

``admin`` may do everything, ``runner`` may work jobs (claim, heartbeat, upload their bundles,
report) and nothing else, ``viewer`` may only read, ``ci`` may read and queue pull-request loop
batches for the one repository it is scoped to (``--repo OWNER/NAME``; the composite action).
A token is 32 random bytes (url-safe base64) behind a ``cpt_`` prefix, so a leaked database
holds no usable credential and a token in a log is easy to recognise.

A runner token may be bound to a runner identity at creation (``--runner NAME``): it may then
claim jobs only under that name. Either way a job belongs to the token that claimed it: another
runner token acting on it gets 403; admins may act on any job.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from service.core.errors import Forbidden
from service.storage import tokens
from service.storage.engine import Conn

TOKEN_PREFIX = "cpt_"
"""Every token starts with it (``contracts.redaction`` hides ``cpt_`` strings in logs)."""
REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")


class Role(StrEnum):
    """What a token may do. Order matters: each role includes the ones below it."""

    VIEWER = "viewer"
    CI = "ci"
    RUNNER = "runner"
    ADMIN = "admin"


# CI ranks with viewers: it reads, and its one extra right (batches of its repository) is checked
# by that route against the token's scope, never by rank.
_RANK = {Role.VIEWER: 0, Role.CI: 0, Role.RUNNER: 1, Role.ADMIN: 2}


def role_allows(role: Role, needed: Role) -> bool:
    """True when ``role`` includes ``needed``."""
    return _RANK[role] >= _RANK[needed]


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def now_iso() -> str:
    """UTC timestamp used in every table."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who presented a token: its row id, role, (runner tokens) bound runner identity and (CI
    tokens) the repository it may queue batches for."""

    token_id: int
    role: Role
    runner: str | None = None
    repo: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


def create_token(
    conn: Conn,
    *,
    role: Role,
    name: str = "",
    runner: str | None = None,
    repo: str | None = None,
) -> str:
    """Insert a new token and return its secret (the only time it exists in clear).

    ``runner`` binds a runner token to that runner identity (claims under another name are
    refused); only runner tokens can be bound. ``repo`` (``OWNER/NAME``) is the one repository
    a CI token queues batches for (a CI token without one queues nothing; the CLI requires it);
    no other role takes it.
    """
    if runner is not None and role is not Role.RUNNER:
        raise ValueError("only runner tokens are bound to a runner identity")
    if runner is not None and not runner.strip():
        raise ValueError("the runner identity must not be empty")
    if repo is not None and role is not Role.CI:
        raise ValueError("only CI tokens are scoped to a repository")
    if repo is not None and not REPO_NAME.match(repo):
        raise ValueError(f"repository {repo!r}: expected OWNER/NAME")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    tokens.insert_token(
        conn, name=name or runner or repo or role.value, role=role.value,
        token_hash=hash_token(token), created_at=now_iso(), runner=runner, repo=repo,
    )  # fmt: skip
    return token


def bind_runner(conn: Conn, principal: Principal, runner: str) -> None:
    """Bind a runner token to ``runner`` on its first claim (or check its binding).

    :raises Forbidden: the token is bound to another name, or another token to this one.
    """
    if principal.runner is not None:
        if principal.runner != runner:
            raise Forbidden(
                f"this token is bound to runner {principal.runner!r}; it cannot claim as {runner!r}"
            )
        return
    if tokens.runner_owner(conn, runner, other_than=principal.token_id) is not None:
        raise Forbidden(f"runner name {runner!r} belongs to another token")
    tokens.bind_runner_name(conn, principal.token_id, runner)


def lookup_principal(conn: Conn, token: str) -> Principal | None:
    """The presented token's id, role and runner identity, or None when it is unknown."""
    row = tokens.token_by_hash(conn, hash_token(token))
    if row is None:
        return None
    return Principal(int(row["id"]), Role(row["role"]), row["runner"], row["repo"])


def lookup_token(conn: Conn, token: str) -> Role | None:
    """The role of a presented token, or None when it is unknown."""
    row = tokens.token_by_hash(conn, hash_token(token))
    return Role(row["role"]) if row else None


def count_tokens(conn: Conn, role: Role | None = None) -> int:
    """How many tokens exist (of one role)."""
    return tokens.count_tokens(conn, None if role is None else role.value)


def list_tokens(conn: Conn) -> list[dict[str, object]]:
    """Every token's id, name, role and creation time (never its hash)."""
    return list(tokens.all_tokens(conn))


def revoke_token(conn: Conn, token_id: int) -> bool:
    """Delete a token; True when it existed.

    API processes cache verified tokens for a few seconds (``service.api.deps.TokenCache``),
    so a revocation made from another process takes effect there within that time.
    """
    return tokens.delete_token(conn, token_id)
