"""``cptrace serve``, ``cptrace worker``, ``cptrace token create``: run and administer the service.

Heavy imports (fastapi, uvicorn, sqlite_utils) happen inside the commands, so ``cptrace`` starts
on a GPU host that has only the runner's dependencies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import typer

from cptrace.errors import CommandError

token_app = typer.Typer(help="Manage API tokens (stored hashed; shown once).", no_args_is_help=True)

DataDir = typer.Option(Path("var"), "--data-dir", help="Directory of the database and blobs.")


def _settings(data_dir: Path):  # type: ignore[no-untyped-def]
    from service.core.config import Settings

    return Settings(data_dir=data_dir)


PARENT_ENV = "CPTRACE_WORKER_PARENT_PID"
"""Set by ``serve`` for its worker: the worker exits when that process is gone."""


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # uvicorn handles SIGTERM itself, then restores this handler and raises the signal again;
    # as SystemExit it unwinds through serve's cleanup, which stops the worker. With the default
    # handler the process would end on the spot and leave the worker running.
    raise SystemExit(128 + signum)


def _follow_parent() -> None:
    """In a worker started by ``serve``: end with the parent, even when it is SIGKILLed."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    if sys.platform.startswith("linux"):
        # PR_SET_PDEATHSIG (1): the kernel sends SIGTERM when the parent thread exits.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        raise SystemExit(0)


def _start_worker(data_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CPTRACE_DATA_DIR": str(data_dir), PARENT_ENV: str(os.getpid())}
    code = "from cptrace.cli import main; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, "worker", "--data-dir", str(data_dir)], env=env
    )


def _stop_worker(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM lets the worker finish its current analysis; kill only if it will not stop."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    data_dir: Path = DataDir,
    seed_demo: bool = typer.Option(False, "--seed-demo", help="Ingest demo/bundles/*.tar.gz once."),
    worker: bool = typer.Option(True, "--worker/--no-worker", help="Start an analysis worker."),
) -> None:
    """Start the API and dashboards (and an analysis worker subprocess).

    On first start it creates the database and an admin token, printed once.

    Example: cptrace serve --host 127.0.0.1 --port 8000 --data-dir var --seed-demo
    """
    import uvicorn

    from cptrace.app import create_app
    from service.bootstrap import default_demo_dir, ensure_admin_token
    from service.bootstrap import seed_demo as seed

    settings = _settings(data_dir)
    app = create_app(settings)
    app.state.blobs.clean_tmp()  # partial uploads of a killed predecessor
    token = ensure_admin_token(app.state.db)
    if token:
        typer.echo(f"Admin token (shown once, stored hashed): {token}")
    if seed_demo:
        for result in seed(app.state.db, settings, default_demo_dir()):
            what = result.error or (
                f"run {result.run_id}" + ("" if result.created else " (already there)")
            )
            typer.echo(f"demo {result.path.name}: {what}")
    proc = _start_worker(data_dir) if worker else None
    typer.echo(f"Dashboard: http://{host}:{port}/")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        if proc is not None:
            _stop_worker(proc)


def worker(
    data_dir: Path = DataDir,
    once: bool = typer.Option(False, "--once", help="Drain the queue, then exit."),
) -> None:
    """Run the analysis worker: takes analysis tasks from the database until stopped.

    Example: cptrace worker --data-dir var
    """
    import logging

    from service.analysis import requeue_stale_reports
    from service.main import open_database
    from service.uploads_exec import lower_priority
    from service.worker import AnalysisWorker

    _follow_parent()
    lower_priority()  # analyses yield the CPU to the API when they share a machine
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = _settings(data_dir)
    open_database(settings).close()  # schema up to date before the first claim
    runner = AnalysisWorker(settings)
    stale = requeue_stale_reports(runner.conn)
    if stale:
        logging.getLogger("cptrace.worker").info(
            "re-analysing %d run(s) with old reports", len(stale)
        )
    signal.signal(signal.SIGTERM, lambda *_: runner.stop.set())
    signal.signal(signal.SIGINT, lambda *_: runner.stop.set())
    try:
        if once:
            while runner.run_once():
                pass
        else:
            runner.run_forever()
    finally:
        runner.close()


def token_create(
    role: str = typer.Option(..., "--role", help="admin, runner or viewer."),
    name: str = typer.Option("", "--name", help="A label for the token."),
    data_dir: Path = DataDir,
) -> None:
    """Create an API token and print it (only its sha256 is stored).

    Example: cptrace token create --role runner --name gpu-host-1 --data-dir var
    """
    from service.auth import Role, create_token
    from service.main import open_database

    try:
        parsed = Role(role)
    except ValueError:
        raise typer.BadParameter(
            f"role must be one of admin, runner, viewer (got {role!r})"
        ) from None
    db = open_database(_settings(data_dir))
    try:
        token = db.write_tx(lambda c: create_token(c, role=parsed, name=name))
    except Exception as exc:
        raise CommandError(f"cannot create the token: {exc}") from exc
    finally:
        db.close()
    typer.echo(token)


def token_list(data_dir: Path = DataDir) -> None:
    """List tokens: id, role, name and creation time (secrets are never stored).

    Example: cptrace token list --data-dir var
    """
    from service.auth import list_tokens
    from service.main import open_database

    db = open_database(_settings(data_dir))
    try:
        tokens = db.read(list_tokens)
    finally:
        db.close()
    for token in tokens:
        typer.echo(f"{token['id']}\t{token['role']}\t{token['name']}\t{token['created_at']}")


def token_revoke(
    token_id: int = typer.Argument(..., help="The id shown by `cptrace token list`."),
    data_dir: Path = DataDir,
) -> None:
    """Revoke a token: requests with it are refused (within seconds in running API processes).

    Example: cptrace token revoke 3 --data-dir var
    """
    from service.auth import revoke_token
    from service.main import open_database

    db = open_database(_settings(data_dir))
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
    token_app.command("create")(token_create)
    token_app.command("list")(token_list)
    token_app.command("revoke")(token_revoke)
    app.add_typer(token_app, name="token")
