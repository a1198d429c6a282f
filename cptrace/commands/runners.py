"""``cptrace run``, ``cptrace upload``, ``cptrace agent`` and ``cptrace bundle check|pack``.

Thin wrappers over ``runners.*`` and ``analyzers.bundle``. Heavy imports (torch via the launcher,
pydantic via the spec) happen inside the commands, so ``cptrace --help`` works anywhere.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import NoReturn

import typer

bundle_app = typer.Typer(help="Check or pack run bundles.", no_args_is_help=True)


def _fail(message: str) -> NoReturn:
    """Report a library error and exit 1.

    Typer >= 0.29 vendors its own click, so a ``click.ClickException`` from the real click
    package is shown as a traceback; printing and ``typer.Exit`` gives the plain message.
    """
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(1)


TokenOpt = typer.Option(
    None, "--token", envvar="CPTRACE_TOKEN", help="Bearer token (default: $CPTRACE_TOKEN)."
)


def _client(server: str, token: str | None):
    from runners.http import ServiceClient

    try:
        return ServiceClient(server, token or os.environ.get("CPTRACE_TOKEN", ""))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def run(
    spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="Workload spec (YAML)."),
    nproc: int | None = typer.Option(None, "--nproc", min=1, help="Processes (default: ranks)."),
    out: Path | None = typer.Option(None, "--out", help="Bundle directory (default: runs/...)."),
    nsys_cmd: str = typer.Option("nsys", "--nsys-cmd", help="How to call Nsight Systems."),
    launcher: str = typer.Option("auto", "--launcher", help="auto, torchrun, srun or fork."),
    pack: bool = typer.Option(False, "--pack", help="Also write OUT.tar.gz."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds per launch."),
    hostname: bool = typer.Option(False, "--hostname", help="Record the host name."),
) -> None:
    """Run a workload spec on N processes, profile it, and write a run bundle.

    Example: cptrace run runners/examples/cpu_smoke.yaml --nproc 2 --out runs/smoke
    """
    from analyzers.bundle import BundleError
    from runners.bundle import pack_bundle
    from runners.launch import LaunchError, LaunchOptions, default_out_dir, run_spec
    from runners.spec import SpecError, load_spec

    try:
        loaded = load_spec(spec)
        target = out or default_out_dir(loaded)
        options = LaunchOptions(
            nproc=nproc,
            launcher=launcher,
            nsys_cmd=tuple(shlex.split(nsys_cmd)),
            timeout_s=timeout,
            include_hostname=hostname,
        )
        bundle_dir = run_spec(loaded, target, options)
    except (SpecError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    except LaunchError as exc:
        where = f"\nbundle with the failure record: {exc.bundle}" if exc.bundle else ""
        _fail(f"{exc}{where}")
    except (BundleError, FileExistsError) as exc:
        _fail(str(exc))
    typer.echo(f"bundle: {bundle_dir}")
    if pack:
        archive = bundle_dir.with_name(bundle_dir.name + ".tar.gz")
        digest = pack_bundle(bundle_dir, archive)
        typer.echo(f"archive: {archive} sha256 {digest}")


def upload(
    bundle: Path = typer.Argument(..., exists=True, help="Bundle directory or .tar.gz."),
    server: str = typer.Option(..., "--server", help="Service URL, e.g. http://127.0.0.1:8000."),
    token: str | None = TokenOpt,
    attempts: int = typer.Option(5, "--attempts", min=1, max=20, help="Tries on 5xx/conn."),
) -> None:
    """Upload a run bundle; a repeated upload of the same content returns the same run.

    Example: cptrace upload runs/smoke --server http://127.0.0.1:8000 --token $CPTRACE_TOKEN
    """
    from analyzers.bundle import BundleError
    from runners.http import RetryPolicy
    from runners.upload import UploadError, upload_bundle

    client = _client(server, token)
    try:
        result = upload_bundle(bundle, client, policy=RetryPolicy(attempts=attempts))
    except BundleError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except UploadError as exc:
        _fail(str(exc))
    state = "created" if result.created else "already uploaded"
    typer.echo(f"run {result.run_id} ({state}) sha256 {result.sha256}")


def _agent_token(token_file: Path | None) -> str:
    """The agent's token: from a file only its owner can read, else ``$CPTRACE_TOKEN``; the
    variable is then removed from this process's environment (children never inherit it)."""
    from runners.sandbox import SandboxError, read_token_file

    from_env = os.environ.pop("CPTRACE_TOKEN", "")
    if token_file is None:
        return from_env
    try:
        return read_token_file(token_file)
    except SandboxError as exc:
        raise typer.BadParameter(str(exc)) from exc


def agent(
    server: str = typer.Option(..., "--server", help="Service URL."),
    token: str | None = typer.Option(None, "--token", hidden=True),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="File holding the runner token (mode 0600; default: "
        "$CPTRACE_TOKEN_FILE, else $CPTRACE_TOKEN).", envvar="CPTRACE_TOKEN_FILE",
    ),
    gpus: int = typer.Option(1, "--gpus", min=0, help="GPUs this runner offers."),
    name: str | None = typer.Option(None, "--name", help="Runner name (default: host name)."),
    work_dir: Path = typer.Option(Path("runs"), "--work-dir", help="Where bundles are made."),
    wait: float = typer.Option(30.0, "--wait", min=0, help="Long-poll seconds per claim."),
    heartbeat: float = typer.Option(15.0, "--heartbeat", min=0.05, help="Heartbeat interval."),
    term_grace: float = typer.Option(300.0, "--term-grace", min=0, help="SIGTERM grace (s)."),
    max_jobs: int | None = typer.Option(None, "--max-jobs", min=1, help="Exit after N jobs."),
    max_idle_polls: int | None = typer.Option(None, "--max-idle-polls", min=1),
    nsys_cmd: str = typer.Option("nsys", "--nsys-cmd", help="How to call Nsight Systems."),
    keep_runs: bool = typer.Option(False, "--keep-runs", help="Keep bundles after upload."),
) -> None:
    """Take jobs from the service, run them (pull-request code in a sandbox), upload their
    bundles (until SIGTERM). The token comes from the environment or a 0600 file, never from
    the command line (any process on the host can read a command line).

    Example: cptrace agent --server http://127.0.0.1:8000 --token-file /etc/cptrace/token --gpus 2
    """
    import logging

    from runners.agent import Agent, AgentConfig
    from runners.http import ApiError
    from runners.launch import LaunchOptions
    from runners.sandbox import SandboxError, make_undumpable
    from runners.workspace import SECRET_ENV

    if token is not None:
        raise typer.BadParameter(
            "the agent takes no token on the command line (other processes can read it): "
            "set CPTRACE_TOKEN or give --token-file (mode 0600)", param_hint="--token"
        )
    try:
        make_undumpable()
    except SandboxError as exc:
        _fail(str(exc))
    secret = _agent_token(token_file)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = AgentConfig(
        gpus=gpus,
        work_dir=work_dir,
        wait_s=wait,
        heartbeat_s=heartbeat,
        term_grace_s=term_grace,
        max_jobs=max_jobs,
        max_idle_polls=max_idle_polls,
        keep_runs=keep_runs,
        launch=LaunchOptions(nsys_cmd=tuple(shlex.split(nsys_cmd))),
        token_file=token_file,
    )
    if name:
        config.runner = name
    runner = Agent(_client(server, secret), config)
    for key in SECRET_ENV:  # the runner needs no GitHub token; no child inherits one
        os.environ.pop(key, None)
    runner.install_signal_handlers()
    try:
        done = runner.serve()
    except (ApiError, SandboxError) as exc:
        _fail(str(exc))
    typer.echo(f"agent {config.runner}: {done} job(s) handled")


@bundle_app.command("check")
def bundle_check(
    bundle: Path = typer.Argument(..., exists=True, help="Bundle directory, .tar or .tar.gz."),
) -> None:
    """Validate a run bundle (manifest, member safety, sha256 of every trace).

    Example: cptrace bundle check demo/bundles/te-2.20.2-reference-3arms-h200x2.tar.gz
    """
    from analyzers.bundle import BundleError, read_bundle

    try:
        with read_bundle(bundle) as opened:
            for trace in opened.traces:
                rank = "all" if trace.rank is None else trace.rank
                typer.echo(f"{trace.member}\t{trace.format}\trank {rank}\t{trace.size} bytes")
            variants = ", ".join(v.name for v in opened.manifest.variants) or "(none)"
            typer.echo(f"ok: bundle_version {opened.bundle_version}, variants: {variants}")
    except BundleError as exc:
        _fail(str(exc))


@bundle_app.command("pack")
def bundle_pack(
    bundle: Path = typer.Argument(..., exists=True, file_okay=False, help="Bundle directory."),
    out: Path | None = typer.Option(None, "--out", help="Archive path (default: DIR.tar.gz)."),
) -> None:
    """Pack a bundle directory into a reproducible .tar.gz (same content, same bytes).

    Example: cptrace bundle pack runs/smoke --out runs/smoke.tar.gz
    """
    from analyzers.bundle import BundleError, read_bundle
    from runners.bundle import pack_bundle

    try:
        read_bundle(bundle).close()
        archive = out or bundle.with_name(bundle.name + ".tar.gz")
        digest = pack_bundle(bundle, archive)
    except (BundleError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(f"{archive} sha256 {digest}")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("upload")(upload)
    app.command("agent")(agent)
    app.add_typer(bundle_app, name="bundle")
