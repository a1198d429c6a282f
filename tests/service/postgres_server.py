"""A real PostgreSQL server for the tests: one per test session, in a temp folder.

``initdb`` and ``pg_ctl`` from Debian's ``postgresql`` package (``make postgres`` installs it)
start a throwaway cluster listening on a free local port with ``trust`` authentication. The
server refuses to run as root, so when the tests run as root it runs as the ``postgres`` system
user (``runuser``), in a folder that user owns. The schema is created once in a template
database; each test gets its own database copied from it (``CREATE DATABASE ... TEMPLATE``,
a file copy: milliseconds, not a schema build).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from service.storage.engine import postgres_engine
from service.storage.schema import create_postgres_schema

TEMPLATE = "cptrace_template"


def _tool(name: str) -> str | None:
    """A server program: on PATH, else in Debian's versioned folder (newest first)."""
    found = shutil.which(name)
    if found is not None:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(candidates[0]) if candidates else None


def postgres_missing() -> str | None:
    """Why no server can be started here, or None."""
    for tool in ("initdb", "pg_ctl"):
        if _tool(tool) is None:
            return f"no {tool} (make postgres installs Debian's postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", _server_user(), "--", *argv]


def _server_user() -> str:
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("no unprivileged user to run PostgreSQL as (postgres, nobody)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """A running cluster: ``url(name)`` is a database's URL; ``stop()`` and ``start()`` take
    it down and up again on the same port (the fault tests)."""

    port: int
    folder: Path
    user: str

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def admin(self) -> sa.Engine:
        engine = postgres_engine(self.url(), pool_size=1)
        return engine.execution_options(isolation_level="AUTOCOMMIT")  # CREATE DATABASE

    def new_database(self) -> str:
        """A fresh database with the schema (a copy of the template); returns its URL."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        engine = self.admin()
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE {TEMPLATE}'))
        finally:
            engine.dispose()
        return self.url(name)

    def running(self) -> bool:
        status = subprocess.run(
            _as_server_user([str(_tool("pg_ctl")), "-D", str(self.folder / "data"), "status"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        return status.returncode == 0

    def start(self) -> None:
        """Start the server (nothing when it runs already)."""
        if self.running():
            return
        # fsync off and a small shared memory: a test cluster, thrown away at the end
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c max_connections=200"
        )
        subprocess.run(
            _as_server_user(
                [str(_tool("pg_ctl")), "-D", str(self.folder / "data"), "-l",
                 str(self.folder / "log"), "-w", "-o", options, "start"]
            ),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True,
        )  # fmt: skip

    def stop(self) -> None:
        """Stop at once (``immediate``: like a crash, no session is told goodbye)."""
        subprocess.run(
            _as_server_user(
                [str(_tool("pg_ctl")), "-D", str(self.folder / "data"), "-m", "immediate", "-w",
                 "stop"]
            ),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
        )  # fmt: skip


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """Start a cluster in a temp folder, yield it, stop it and remove the folder."""
    folder = Path(tempfile.mkdtemp(prefix="cptrace-pg-"))
    if os.geteuid() == 0:
        entry = pwd.getpwnam(_server_user())
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    user = "cptrace"
    subprocess.run(
        _as_server_user(
            [str(_tool("initdb")), "-D", str(folder / "data"), "-U", user, "--auth=trust",
             "-E", "UTF8", "--no-sync"]
        ),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True,
    )  # fmt: skip
    server = PostgresServer(port=_free_port(), folder=folder, user=user)
    server.start()
    try:
        engine = server.admin()
        with engine.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {TEMPLATE}"))
        engine.dispose()
        template = postgres_engine(server.url(TEMPLATE), pool_size=1)
        with template.begin() as conn:
            create_postgres_schema(conn)
        template.dispose()
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
