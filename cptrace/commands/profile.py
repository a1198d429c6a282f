"""``cptrace profile [OPTIONS] -- CMD [ARGS...]``: profile the user's own job, write a run bundle.

A thin wrapper over ``runners.profile.run.profile_job``; torch and the runners load only when
the command runs, so ``cptrace --help`` works anywhere.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer

from cptrace.commands.runners import _fail


def profile(
    ctx: typer.Context,
    command: list[str] = typer.Argument(None, help="The job: python/torchrun/srun and its args."),
    out: Path | None = typer.Option(None, "--out", help="Bundle directory (default: runs/...)."),
    nsys: bool | None = typer.Option(
        None, "--nsys/--no-nsys", help="Nsight Systems per rank (default: when nsys is found)."
    ),
    torch: bool = typer.Option(False, "--torch", help="PyTorch profiler, stepped by the job."),
    probe: bool = typer.Option(False, "--probe", help="Record TE/cp_attn metadata facts."),
    nsys_cmd: str = typer.Option("nsys", "--nsys-cmd", help="How to call Nsight Systems."),
    nsys_args: str = typer.Option("", "--nsys-args", help="Extra nsys profile flags (one string)."),
    nsys_trace: str = typer.Option("cuda,nvtx", "--nsys-trace", help="nsys profile -t value."),
    capture_range: bool = typer.Option(
        False, "--capture-range", help="Capture between the job's cudaProfilerStart/Stop."
    ),
    delay: float | None = typer.Option(None, "--delay", min=0, help="nsys: wait before capture."),
    duration: float | None = typer.Option(None, "--duration", min=0, help="nsys: capture seconds."),
    no_functions_trace: bool = typer.Option(
        False, "--no-python-functions-trace", help="nsys: no ranges around TE helpers."
    ),
    torch_wait: int = typer.Option(1, "--torch-wait", min=0, help="Steps before warm-up."),
    torch_warmup: int = typer.Option(1, "--torch-warmup", min=0, help="Warm-up steps."),
    torch_active: int = typer.Option(3, "--torch-active", min=1, help="Recorded steps."),
    step_function: str = typer.Option(
        "optimizer", "--step-function", help="What a step is: optimizer or MODULE:FUNC."
    ),
    no_stack: bool = typer.Option(False, "--no-stack", help="torch: no Python stacks."),
    record_shapes: bool = typer.Option(False, "--record-shapes", help="torch: input shapes."),
    no_sync_lines: bool = typer.Option(
        False, "--no-sync-lines",
        help="torch: do not record the line of each CUDA sync (CUDA sync debug mode 'warn').",
    ),
    probe_first: int = typer.Option(16, "--probe-first", min=0, help="Probe the first N calls."),
    probe_every: int = typer.Option(50, "--probe-every", min=0, help="Then 1 in M calls."),
    watchdog: float = typer.Option(
        60.0, "--watchdog", min=0, help="Stop the job this long after a rank fails (s)."
    ),
    hang_timeout: float = typer.Option(
        300.0, "--hang-timeout", min=0,
        help="Hung: a rank waits this long in one collective (stacks, then stop; 0: off).",
    ),
    time_warmup: int = typer.Option(
        1, "--time-warmup", min=0, help="Steps left out of the iteration times at the start."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="Do not echo the job's output (log only)."),
    timeout: float | None = typer.Option(None, "--timeout", min=0, help="Stop the job after (s)."),
    name: str | None = typer.Option(None, "--name", help="Run name (default from the script)."),
    hostname: bool = typer.Option(False, "--hostname", help="Record the host name."),
    pack: bool = typer.Option(False, "--pack", help="Also write OUT.tar.gz."),
) -> None:
    """Profile your own job (python, torchrun, srun) without editing it; write a run bundle.

    Each rank gets its own nsys report and/or PyTorch-profiler trace; --probe records the
    packed-metadata facts TE and cp_attn saw. Every step is timed (the run's iteration times).
    The job's output streams to the terminal and into logs/profile.log. A failed or hung job
    still gets a bundle, with the failing rank, its exception and every rank's Python stack.

    Example: cptrace profile --torch --probe --out runs/mine -- torchrun --nproc-per-node 2 train.py
    """
    from datetime import UTC, datetime

    from analyzers.bundle import BundleError
    from runners.bundle import pack_bundle
    from runners.profile.command import ProfileCommandError
    from runners.profile.run import ProfileError, ProfileOptions, nsys_available, profile_job

    argv = list(command or []) + list(ctx.args)
    if not argv:
        raise typer.BadParameter("no command: cptrace profile [OPTIONS] -- CMD [ARGS...]")
    nsys_tuple = tuple(shlex.split(nsys_cmd))
    use_nsys = nsys if nsys is not None else (nsys_available(nsys_tuple) or not (torch or probe))
    options = ProfileOptions(
        nsys=use_nsys,
        torch=torch,
        probe=probe,
        nsys_cmd=nsys_tuple,
        nsys_trace=nsys_trace,
        nsys_extra=tuple(shlex.split(nsys_args)),
        python_functions_trace=not no_functions_trace,
        capture_range=capture_range,
        delay_s=delay,
        duration_s=duration,
        torch_wait=torch_wait,
        torch_warmup=torch_warmup,
        torch_active=torch_active,
        step_on=step_function,
        with_stack=not no_stack,
        record_shapes=record_shapes,
        sync_lines=not no_sync_lines,
        probe_first=probe_first,
        probe_every=probe_every,
        watchdog_s=watchdog,
        hang_timeout_s=hang_timeout or None,
        time_warmup=time_warmup,
        timeout_s=timeout,
        name=name,
        include_hostname=hostname,
        echo=None if quiet else lambda text: typer.echo(text, nl=False),
    )
    target = out or Path("runs") / f"profile-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    try:
        result = profile_job(argv, target, options)
    except ProfileCommandError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except (ProfileError, BundleError, FileExistsError) as exc:
        _fail(str(exc))
    typer.echo(f"bundle: {result.bundle}")
    if pack:
        archive = result.bundle.with_name(result.bundle.name + ".tar.gz")
        digest = pack_bundle(result.bundle, archive)
        typer.echo(f"archive: {archive} sha256 {digest}")
    if result.iterations or result.failure is None:
        typer.echo(_timing_line(result.iterations))
    if result.failure is not None:
        for line in failure_lines(result.failure):
            typer.echo(line, err=True)
        _fail(f"the job failed: {result.failure['summary']} (recorded in {result.bundle})")


def _timing_line(iterations: dict[int, list[float]]) -> str:
    if not iterations:
        return ("steps: none timed (fewer steps than the warm-up and the profiled ones, or no "
                "step boundary seen: see --step-function, --time-warmup)")
    import statistics

    per_rank = ", ".join(
        f"rank {r}: n={len(v)} median {statistics.median(v):.3f} ms"
        for r, v in sorted(iterations.items())
    )
    return f"steps timed: {per_rank}"


def failure_lines(failure: dict[str, Any]) -> list[str]:
    """The failure record for a terminal: each rank's stack, then the end of the log."""
    lines: list[str] = []
    for rank, stack in (failure.get("stacks") or {}).items():
        lines.append(f"--- rank {rank}: Python stacks when the job was stopped ---")
        lines += stack.rstrip().splitlines()
    exc = failure.get("exception") or {}
    if exc.get("traceback"):
        lines.append(f"--- rank {failure.get('failed_rank')}: traceback ---")
        lines += [str(x) for x in exc["traceback"]]
    return lines


def register(app: typer.Typer) -> None:
    app.command(
        "profile",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(profile)
