"""FastAPI dependencies as named ``Annotated`` aliases (the template's ``deps.py``).

``DbDep`` gives the app's ``Database`` (pass it to the ``service.store`` read functions);
``ReadAccess`` / ``RunnerAccess`` / ``AdminAccess`` check the bearer token's role. Reads are
anonymous when ``CPTRACE_PUBLIC_READ`` is true; writes never are.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.auth import Role, lookup_token, role_allows
from service.core.config import Settings
from service.core.errors import Forbidden, Unauthorized
from service.storage.blobs import BlobStore
from service.storage.database import Database

_bearer = HTTPBearer(auto_error=False, description="A cptrace token: `cptrace token create`.")


def get_db(request: Request) -> Database:
    """The app's database (one writer thread, per-thread readers)."""
    db: Database = request.app.state.db
    return db


def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    settings: Settings = request.app.state.settings
    return settings


def get_blobs(request: Request) -> BlobStore:
    """The content-addressed blob store."""
    blobs: BlobStore = request.app.state.blobs
    return blobs


DbDep = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
BlobsDep = Annotated[BlobStore, Depends(get_blobs)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def token_role(db: DbDep, credentials: Credentials) -> Role | None:
    """The role of the presented token; None when none was presented.

    :raises Unauthorized: a token was presented but is not known.
    """
    if credentials is None:
        return None
    role = db.read(lambda c: lookup_token(c, credentials.credentials))
    if role is None:
        raise Unauthorized("the bearer token is not valid")
    return role


TokenRole = Annotated[Role | None, Depends(token_role)]


def _require(needed: Role, role: Role | None, *, action: str) -> Role:
    if role is None:
        raise Unauthorized(f"{action} needs a bearer token (Authorization: Bearer <token>)")
    if not role_allows(role, needed):
        raise Forbidden(f"{action} needs the {needed.value} role; this token is {role.value}")
    return role


def read_access(settings: SettingsDep, role: TokenRole) -> Role | None:
    """Reads: anonymous when public reads are on, else any valid token."""
    if settings.public_read:
        return role
    return _require(Role.VIEWER, role, action="reading")


def runner_access(role: TokenRole) -> Role:
    """Uploads and job work: runner or admin."""
    return _require(Role.RUNNER, role, action="this write")


def admin_access(role: TokenRole) -> Role:
    """Deleting, submitting jobs, re-analysing: admin only."""
    return _require(Role.ADMIN, role, action="this write")


ReadAccess = Annotated[Role | None, Depends(read_access)]
RunnerAccess = Annotated[Role, Depends(runner_access)]
AdminAccess = Annotated[Role, Depends(admin_access)]
