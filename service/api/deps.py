"""FastAPI dependencies as named ``Annotated`` aliases (the template's ``deps.py``).

``DbDep`` gives the app's database, either backend (pass it to the ``service.store`` reads);
``ReadAccess`` / ``RunnerAccess`` / ``AdminAccess`` check the bearer token's role. Reads are
anonymous when ``CPTRACE_PUBLIC_READ`` is true; writes never are.

Every dependency here is ``async def``: FastAPI runs a plain ``def`` dependency in the thread
pool, and a hop there and back costs more than the work these do (an attribute read, a dict
lookup). The one that can touch SQLite, ``token_role``, asks ``TokenCache`` first; a miss is an
indexed lookup of one row (tens of microseconds), cheaper inline than a thread hop.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.auth import Principal, Role, hash_token, lookup_principal, lookup_token, role_allows
from service.core.config import Settings
from service.core.errors import Forbidden, Unauthorized
from service.storage.blobs import Blobs
from service.storage.engine import AnyDatabase

_bearer = HTTPBearer(auto_error=False, description="A cptrace token: `cptrace token create`.")


async def get_db(request: Request) -> AnyDatabase:
    """The app's database (one writer thread, per-thread readers)."""
    db: AnyDatabase = request.app.state.db
    return db


async def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    settings: Settings = request.app.state.settings
    return settings


async def get_blobs(request: Request) -> Blobs:
    """The content-addressed blob store (a local folder or S3)."""
    blobs: Blobs = request.app.state.blobs
    return blobs


DbDep = Annotated[AnyDatabase, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
BlobsDep = Annotated[Blobs, Depends(get_blobs)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


class TokenCache:
    """Roles of recently verified tokens, by token hash, for ``ttl_s`` seconds.

    Only tokens that verified are kept: an unknown token is looked up every time, so a token
    created a moment ago works at once and random tokens cannot fill the cache. A token deleted
    or demoted in the database keeps its cached role for at most ``ttl_s``; code that revokes a
    token in this process calls ``forget`` (or ``clear``) so it takes effect at once.
    """

    def __init__(self, *, ttl_s: float = 5.0, max_entries: int = 1024) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._roles: dict[str, tuple[Role, float]] = {}
        self._lock = threading.Lock()

    def get(self, token_hash: str) -> Role | None:
        """The cached role, or None when absent or older than the TTL."""
        entry = self._roles.get(token_hash)
        if entry is None or time.monotonic() - entry[1] > self.ttl_s:
            return None
        return entry[0]

    def put(self, token_hash: str, role: Role) -> None:
        with self._lock:
            if len(self._roles) >= self.max_entries:
                self._roles.clear()  # a handful of live tokens refill it in one TTL
            self._roles[token_hash] = (role, time.monotonic())

    def forget(self, token_hash: str) -> None:
        """Drop one token (after revoking or demoting it)."""
        with self._lock:
            self._roles.pop(token_hash, None)

    def clear(self) -> None:
        with self._lock:
            self._roles.clear()


# One cache per database: two apps (tests) over two databases never share verified tokens.
_token_caches: weakref.WeakKeyDictionary[AnyDatabase, TokenCache] = weakref.WeakKeyDictionary()


def token_cache(db: AnyDatabase) -> TokenCache:
    """The token cache of ``db`` (created on first use)."""
    cache = _token_caches.get(db)
    if cache is None:
        cache = _token_caches.setdefault(db, TokenCache())
    return cache


async def token_role(db: DbDep, credentials: Credentials) -> Role | None:
    """The role of the presented token; None when none was presented.

    :raises Unauthorized: a token was presented but is not known.
    """
    if credentials is None:
        return None
    token = credentials.credentials
    cache = token_cache(db)
    token_hash = hash_token(token)
    role = cache.get(token_hash)
    if role is not None:
        return role
    role = db.read(lambda c: lookup_token(c, token))
    if role is None:
        raise Unauthorized("the bearer token is not valid")
    cache.put(token_hash, role)
    return role


TokenRole = Annotated[Role | None, Depends(token_role)]


def require_role(needed: Role, role: Role | None, *, action: str) -> Role:
    """The one role check: 401 without a token, 403 when the role is below ``needed``."""
    if role is None:
        raise Unauthorized(f"{action} needs a bearer token (Authorization: Bearer <token>)")
    if not role_allows(role, needed):
        raise Forbidden(f"{action} needs the {needed.value} role; this token is {role.value}")
    return role


async def read_access(settings: SettingsDep, role: TokenRole) -> Role | None:
    """Reads: anonymous when public reads are on, else any valid token."""
    if settings.public_read:
        return role
    return require_role(Role.VIEWER, role, action="reading")


async def runner_access(role: TokenRole) -> Role:
    """Uploads and job work: runner or admin."""
    return require_role(Role.RUNNER, role, action="this write")


async def admin_access(role: TokenRole) -> Role:
    """Deleting, submitting jobs, re-analysing: admin only."""
    return require_role(Role.ADMIN, role, action="this write")


async def runner_principal(db: DbDep, credentials: Credentials, _: RunnerAccess) -> Principal:
    """The token behind a runner's write (its role already checked by ``RunnerAccess``)."""
    assert credentials is not None  # RunnerAccess refused anonymous calls
    principal = db.read(lambda c: lookup_principal(c, credentials.credentials))
    if principal is None:  # revoked since the role check's cache entry
        raise Unauthorized("the bearer token is not valid")
    return principal


ReadAccess = Annotated[Role | None, Depends(read_access)]
RunnerAccess = Annotated[Role, Depends(runner_access)]
AdminAccess = Annotated[Role, Depends(admin_access)]
RunnerPrincipal = Annotated[Principal, Depends(runner_principal)]
