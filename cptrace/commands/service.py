"""``cptrace serve``, ``cptrace worker``, ``cptrace token create``: run and administer the service.

Heavy imports (fastapi, uvicorn, sqlite_utils) happen inside the commands, so ``cptrace`` starts
on a GPU host that has only the runner's dependencies.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import typer

from cptrace.errors import CommandError

DataDir = typer.Option(Path("var"), "--data-dir", help="Directory of the database and blobs.")
BlobsAt = typer.Option(
    None,
    "--blobs",
    help="Where blobs live: a folder or s3://bucket/prefix (default: DATA_DIR/blobs; "
    "CPTRACE_BLOBS).",
)

DatabaseAt = typer.Option(
    None,
    "--database",
    help="The database: empty for SQLite in DATA_DIR, or postgresql://USER@HOST/NAME "
    "(CPTRACE_DATABASE_URL).",
)


def _blobs(blobs: str | None) -> dict[str, str]:
    """``--blobs`` when given; else the ``CPTRACE_BLOBS`` variable or the default decides."""
    return {} if blobs is None else {"blobs": blobs}


def _database(url: str | None) -> dict[str, str]:
    """``--database`` when given; else ``CPTRACE_DATABASE_URL`` or the default decides."""
    return {} if url is None else {"database_url": url}


def _settings(data_dir: Path, **values: object):  # type: ignore[no-untyped-def]
    """The service's settings; a bad ``CPTRACE_*`` value is one ``Error:`` line, no traceback."""
    from service.core.config import Settings, SettingsError

    try:
        return Settings(data_dir=data_dir, **values)
    except SettingsError as exc:
        raise CommandError(str(exc)) from None


def _open_database(data_dir: Path, database: str | None):  # type: ignore[no-untyped-def]
    """The configured database for a token command; one ``Error:`` line when it cannot be
    opened (a PostgreSQL server that cannot be reached)."""
    from service.main import open_database
    from service.storage.engine import DatabaseUrlError

    try:
        return open_database(_settings(data_dir, **_database(database)))
    except DatabaseUrlError as exc:
        raise CommandError(str(exc)) from None


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # uvicorn handles SIGTERM itself, then restores this handler and raises the signal again;
    # as SystemExit it unwinds through serve's cleanup. With the default handler the process
    # would end on the spot and leave the worker running.
    raise SystemExit(128 + signum)


def _seed_demo(db: Any, settings: Any) -> None:
    """The captured bundles of ``demo/bundles``, then the ones built from ``demo/traces`` (into
    the data directory; byte-reproducible, so a later start finds them seeded)."""
    from runners.demo_bundles import build_trace_bundles
    from service.bootstrap import default_demo_dir, seed_demo

    folders = [default_demo_dir()]
    try:
        build_trace_bundles(settings.data_dir / "demo-bundles")
        folders.append(settings.data_dir / "demo-bundles")
    except FileNotFoundError as exc:
        typer.echo(f"demo trace bundles not built ({exc}); seeding demo/bundles only")
    for folder in folders:
        for result in seed_demo(db, settings, folder):
            what = result.error or (
                f"run {result.run_id}" + ("" if result.created else " (already there)")
            )
            typer.echo(f"demo {result.path.name}: {what}")


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    data_dir: Path = DataDir,
    seed_demo: bool = typer.Option(
        False, "--seed-demo", help="Ingest the demo bundles once (demo/bundles, demo/traces)."
    ),
    worker: bool = typer.Option(True, "--worker/--no-worker", help="Start an analysis worker."),
    blobs: str | None = BlobsAt,
    database: str | None = DatabaseAt,
) -> None:
    """Start the API and dashboards (and an analysis worker subprocess).

    On first start it creates the database and an admin token, printed once.

    Example: cptrace serve --host 127.0.0.1 --port 8000 --data-dir var --seed-demo
    """
    import uvicorn

    from cptrace.app import create_app
    from service.bootstrap import ensure_admin_token, sweep_at_startup
    from service.http_timeouts import timed_protocol

    # The API supervises the worker (service.supervisor): restarted when it dies, on /health.
    from service.storage.blobs import BlobConfigError
    from service.storage.engine import DatabaseUrlError

    settings = _settings(data_dir, run_worker=worker, **_blobs(blobs), **_database(database))
    try:
        app = create_app(settings)
    except DatabaseUrlError as exc:  # a PostgreSQL server that cannot be reached: one line
        raise CommandError(str(exc)) from None
    try:
        swept = sweep_at_startup(app.state.db, settings)  # what a killed predecessor left
    except BlobConfigError as exc:  # an S3 store that cannot be reached: one line, no traceback
        raise CommandError(str(exc)) from None
    if swept.total:
        typer.echo(f"Removed after an unclean stop: {swept.describe()}")
    token = ensure_admin_token(app.state.db)
    if token:
        typer.echo(f"Admin token (shown once, stored hashed): {token}")
    if seed_demo:
        _seed_demo(app.state.db, settings)
    typer.echo(f"Dashboard: http://{host}:{port}/")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=timed_protocol(settings),  # header and body timeouts: slow clients are cut off
        timeout_keep_alive=settings.http_keep_alive_s,
        h11_max_incomplete_event_size=64 * 1024,  # request line + headers
    )


def worker(
    data_dir: Path = DataDir,
    once: bool = typer.Option(False, "--once", help="Drain the queue, then exit."),
    blobs: str | None = BlobsAt,
    database: str | None = DatabaseAt,
) -> None:
    """Run the analysis worker: takes analysis tasks from the database until stopped.

    Example: cptrace worker --data-dir var
    """
    import logging

    from service.storage.blobs import BlobConfigError
    from service.storage.engine import DatabaseUrlError
    from service.worker import main

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        main(_settings(data_dir, **_blobs(blobs), **_database(database)), once=once)
    except (BlobConfigError, DatabaseUrlError) as exc:  # S3 or PostgreSQL unreachable
        raise CommandError(str(exc)) from None


def token_create(
    role: str = typer.Option(..., "--role", help="admin, runner, ci or viewer."),
    name: str = typer.Option("", "--name", help="A label for the token."),
    runner: str | None = typer.Option(
        None,
        "--runner",
        help="Runner tokens: bind the token to this runner identity (it may claim jobs only "
        "under this name). Jobs always belong to the token that claimed them.",
    ),
    repo: str | None = typer.Option(
        None,
        "--repo",
        help="CI tokens: the one repository (OWNER/NAME) whose batches it may queue.",
    ),
    data_dir: Path = DataDir,
    database: str | None = DatabaseAt,
) -> None:
    """Create an API token and print it (only its sha256 is stored).

    Example: cptrace token create --role runner --runner gpu-host-1 --data-dir var
    """
    from service.auth import Role, create_token

    try:
        parsed = Role(role)
    except ValueError:
        raise typer.BadParameter(
            f"role must be one of admin, runner, ci, viewer (got {role!r})"
        ) from None
    if runner is not None and parsed is not Role.RUNNER:
        raise typer.BadParameter("--runner binds a runner token; use it with --role runner")
    if runner is not None and not runner.strip():
        raise typer.BadParameter("--runner needs a name (the agent's --runner / host name)")
    if (repo is not None) != (parsed is Role.CI):
        raise typer.BadParameter("a ci token needs --repo OWNER/NAME; other roles take none")
    db = _open_database(data_dir, database)
    try:
        token = db.write_tx(
            lambda c: create_token(c, role=parsed, name=name, runner=runner, repo=repo)
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except Exception as exc:
        raise CommandError(f"cannot create the token: {exc}") from exc
    finally:
        db.close()
    typer.echo(token)


def token_list(data_dir: Path = DataDir, database: str | None = DatabaseAt) -> None:
    """List tokens: id, role, name and creation time (secrets are never stored).

    Example: cptrace token list --data-dir var
    """
    from service.auth import list_tokens

    db = _open_database(data_dir, database)
    try:
        tokens = db.read(list_tokens)
    finally:
        db.close()
    for token in tokens:
        bound = f"\trunner={token['runner']}" if token.get("runner") else ""
        bound += f"\trepo={token['repo']}" if token.get("repo") else ""
        typer.echo(f"{token['id']}\t{token['role']}\t{token['name']}\t{token['created_at']}{bound}")


def token_revoke(
    token_id: int = typer.Argument(..., help="The id shown by `cptrace token list`."),
    data_dir: Path = DataDir,
    database: str | None = DatabaseAt,
) -> None:
    """Revoke a token: requests with it are refused (within seconds in running API processes).

    Example: cptrace token revoke 3 --data-dir var
    """
    from service.auth import revoke_token

    db = _open_database(data_dir, database)
    try:
        removed = db.write_tx(lambda c: revoke_token(c, token_id))
    finally:
        db.close()
    if not removed:
        raise CommandError(f"no token with id {token_id} (see: cptrace token list)")
    typer.echo(f"revoked token {token_id}")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("worker")(worker)
    # a group of its own per app: ``cptrace.cli.build_app`` may build more than one app in a
    # process (the console script's and the whole one), and a shared group would collect every
    # registration twice
    token_app = typer.Typer(
        help="Manage API tokens (stored hashed; shown once).", no_args_is_help=True
    )
    token_app.command("create")(token_create)
    token_app.command("list")(token_list)
    token_app.command("revoke")(token_revoke)
    app.add_typer(token_app, name="token")
