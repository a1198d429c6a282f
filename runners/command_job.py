"""A pull-request loop job that runs the repository's own command under ``cptrace profile``.

The suite's command entry (``contracts.profile_entry.CommandEntry``) runs in the job's checkout,
through the same code as ``cptrace profile`` (``runners.profile.run.profile_job``): each rank
profiled, supervised by the failure watchdog, a bundle written in the ``cptrace run`` format.
The agent tags the bundle like a spec job's (repo, branch, commit, pull request, suite, entry
name) plus the entry's configuration key (command line + profiler settings), which the baseline
search matches on.

The command is the pull request's code: it runs without the runner's credentials in its
environment (``runners.workspace.SECRET_ENV``), like the setup command. The agent's own Python
environment comes first on ``PATH``, so ``torchrun`` and ``python`` are the ones cptrace runs
with (torch and the profiler bootstrap are there).

A run that does not end cleanly (non-zero exit, a rank's exception stopped by the watchdog,
the timeout) fails the job with the failure summary and the log's tail, as a spec job's failed
launch does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contracts.profile_entry import CommandEntry
from contracts.validation import first_error
from runners.launch import LaunchError, LaunchOptions
from runners.spec import SpecError
from runners.workspace import without_secrets


def parse_command_entry(raw: Any, *, source: str) -> CommandEntry:
    """The job's command entry; :raises SpecError: naming the first bad field."""
    try:
        return CommandEntry.model_validate(raw)
    except ValidationError as exc:
        first = first_error(exc)
        raise SpecError(f"{source}: {first.where('(entry)')}: {first.message}") from exc


def is_command_job(spec: Any) -> bool:
    """Whether a claimed job's ``spec`` is a command entry rather than a workload spec."""
    return isinstance(spec, dict) and spec.get("kind") == "command"


def job_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ours without credentials, our interpreter's bin first."""
    env = without_secrets(os.environ if environ is None else environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (bindir, env.get("PATH", "")) if p)
    return env


def _timeout(entry: CommandEntry, launch: LaunchOptions) -> float | None:
    limits = [t for t in (entry.profile.timeout_s, launch.timeout_s) if t is not None]
    return min(limits) if limits else None


def run_command_entry(
    entry: CommandEntry, workspace: Path, out: Path, launch: LaunchOptions
) -> Path:
    """Profile ``entry`` in ``workspace``, write its bundle at ``out``; returns ``out``.

    :raises LaunchError: the command could not be profiled or did not end cleanly (the
        message is the failure summary, ``log_tail`` the job's log).
    """
    from runners.profile.command import ProfileCommandError
    from runners.profile.run import ProfileError, ProfileOptions, profile_job
    from runners.profile.supervise import log_tail

    settings = entry.profile
    options = ProfileOptions(
        nsys=settings.nsys,
        torch=settings.torch,
        probe=settings.probe,
        nsys_cmd=launch.nsys_cmd,
        nsys_trace=settings.nsys_trace,
        torch_wait=settings.torch_wait,
        torch_warmup=settings.torch_warmup,
        torch_active=settings.torch_active,
        step_on=settings.step_function,
        with_stack=settings.with_stack,
        record_shapes=settings.record_shapes,
        watchdog_s=settings.watchdog_s,
        hang_timeout_s=settings.hang_timeout_s,
        time_warmup=settings.time_warmup,
        timeout_s=_timeout(entry, launch),
        name=entry.name,
        include_hostname=launch.include_hostname,
        cancel=launch.cancel,
        cwd=workspace,
        env=job_environment(),
        run_tags=launch.run_tags,
        sandbox=launch.sandbox,
    )
    log = out / "logs" / "profile.log"
    try:
        result = profile_job(entry.argv, out, options)
    except ProfileCommandError as exc:
        raise LaunchError(f"command {entry.name!r} cannot be profiled: {exc}") from exc
    except ProfileError as exc:
        raise LaunchError(str(exc), log_tail=log_tail(log)) from exc
    if result.failure is not None:
        error = LaunchError(
            f"command {entry.name!r} failed: {result.failure['summary']}",
            log_tail=result.supervised.tail(),
            supervised=result.supervised,
        )
        error.bundle = result.bundle
        raise error
    return result.bundle
