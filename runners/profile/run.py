"""``cptrace profile -- CMD``: run the user's own job under nsys and/or the PyTorch profiler.

The job is not edited. cptrace rewrites the command so each rank is profiled
(``runners/profile/command.py``), puts the bootstrap on the children's ``PYTHONPATH`` (rank
status, torch profiler, probe), supervises the job with the failure watchdog, and writes a run
bundle in the format ``cptrace run`` writes (``runners/bundle.py``): traces per rank, the
probe's facts, the environment, the command line without secrets, the exit status, and a
``failure`` record when the job did not end cleanly. A failed or hung job still gets a bundle.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzers.bundle import MANIFEST_NAME
from runners import bundle as bundle_writer
from runners import nsys as nsys_cmds
from runners.env import capture_environment
from runners.profile.command import (
    Launch,
    NsysPlan,
    ProfileCommandError,
    find_nsys,
    parse_launch,
    redact_argv,
    scrub,
    secret_values,
    wrapped_command,
)
from runners.profile.facts import observed_facts, read_probe_files
from runners.profile.probe.record import NO_CALL
from runners.profile.rankstatus import STATUS_ENV
from runners.profile.steps import STEPS_ENV, StepsConfig
from runners.profile.steptimes import iteration_times, read_step_files
from runners.profile.supervise import Supervised, failure_record, supervise
from runners.profile.synclines import read_sync_files
from runners.profile.torchprof import TORCH_PROFILE_ENV, TorchProfileConfig
from runners.sandbox import Sandbox, remove_special_files

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
PROBE_ENV = "CPTRACE_PROBE"
_NSYS_REPORT = re.compile(r"^nsys_rank(?P<rank>\d*)_pid(?P<pid>\d+)$")


class ProfileError(RuntimeError):
    """The profile could not produce a bundle (the message says why and what to do)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileOptions:
    """Everything ``cptrace profile`` is told besides the command."""

    nsys: bool = False
    torch: bool = False
    probe: bool = False
    nsys_cmd: tuple[str, ...] = ("nsys",)
    nsys_trace: str = "cuda,nvtx"
    nsys_extra: tuple[str, ...] = ()
    python_functions_trace: bool = True
    capture_range: bool = False
    delay_s: float | None = None
    duration_s: float | None = None
    torch_wait: int = 1
    torch_warmup: int = 1
    torch_active: int = 3
    step_on: str = "optimizer"
    with_stack: bool = True
    record_shapes: bool = False
    sync_lines: bool = True
    """``--torch``: record the line of each synchronizing CUDA call while profiling."""
    probe_first: int = 16
    probe_every: int = 50
    watchdog_s: float = 60.0
    hang_timeout_s: float | None = 300.0
    """A rank waiting this long in one collective makes the job hung (stacks, then stop)."""
    time_warmup: int = 1
    """Steps left out of the iteration times at the start of each rank."""
    timeout_s: float | None = None
    name: str | None = None
    include_hostname: bool = False
    cancel: threading.Event | None = None
    cwd: Path | None = None
    """Run the command in this directory (``cptrace agent``: the job's checkout); None: here."""
    env: Mapping[str, str] | None = None
    """The job's base environment instead of ours (the agent removes its credentials)."""
    run_tags: dict[str, Any] | None = None
    """Extra manifest ``run`` fields (the agent's pull-request jobs: repo, commit, suite, ...)."""
    sandbox: Sandbox | None = None
    """Run the command in this sandbox (``cptrace agent``: pull-request code), with only its
    checkout (``cwd``), the bundle and the scratch directory writable."""
    echo: Callable[[str], None] | None = None
    """Gets the job's output as it comes (``cptrace profile``: the terminal); the log keeps it."""


def options_argv(opts: ProfileOptions) -> list[str]:
    """The ``cptrace profile`` options that made ``opts``, for ``run.command``: the profilers
    always, every other option only where it differs from the default (``--nsys-args`` goes
    through :func:`redact_argv` with the job's command)."""
    default = ProfileOptions()
    out = ["--nsys" if opts.nsys else "--no-nsys"]
    out += [flag for flag, on in (("--torch", opts.torch), ("--probe", opts.probe)) if on]
    valued: tuple[tuple[str, Any, Any], ...] = (
        ("--nsys-cmd", " ".join(opts.nsys_cmd), " ".join(default.nsys_cmd)),
        ("--nsys-trace", opts.nsys_trace, default.nsys_trace),
        ("--nsys-args", " ".join(opts.nsys_extra), ""),
        ("--delay", opts.delay_s, default.delay_s),
        ("--duration", opts.duration_s, default.duration_s),
        ("--torch-wait", opts.torch_wait, default.torch_wait),
        ("--torch-warmup", opts.torch_warmup, default.torch_warmup),
        ("--torch-active", opts.torch_active, default.torch_active),
        ("--step-function", opts.step_on, default.step_on),
        ("--probe-first", opts.probe_first, default.probe_first),
        ("--probe-every", opts.probe_every, default.probe_every),
        ("--watchdog", opts.watchdog_s, default.watchdog_s),
        ("--hang-timeout", opts.hang_timeout_s or 0, default.hang_timeout_s),
        ("--time-warmup", opts.time_warmup, default.time_warmup),
        ("--timeout", opts.timeout_s, default.timeout_s),
        ("--name", opts.name, default.name),
    )
    for flag, value, usual in valued:
        if value != usual and value is not None:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    switches = (
        ("--capture-range", opts.capture_range),
        ("--no-python-functions-trace", not opts.python_functions_trace),
        ("--no-stack", not opts.with_stack),
        ("--record-shapes", opts.record_shapes),
        ("--no-sync-lines", not opts.sync_lines),
        ("--hostname", opts.include_hostname),
    )
    return out + [flag for flag, on in switches if on]


@dataclass(slots=True)
class ProfileResult:
    bundle: Path
    supervised: Supervised
    failure: dict[str, Any] | None
    traces: list[dict[str, Any]] = field(default_factory=list)
    iterations: dict[int, list[float]] = field(default_factory=dict)
    """rank -> the timed steps' ms (the manifest's ``iteration_ms``)."""

    @property
    def ok(self) -> bool:
        return self.failure is None


def nsys_available(nsys_cmd: tuple[str, ...] = ("nsys",)) -> bool:
    """Whether ``--nsys`` can be the default (the nsys binary is found)."""
    try:
        find_nsys(list(nsys_cmd))
    except ProfileCommandError:
        return False
    return True


def child_environment(opts: ProfileOptions, scratch: Path) -> dict[str, str]:
    """The job's environment: ours, plus the bootstrap and where each hook writes."""
    env = dict(os.environ if opts.env is None else opts.env)
    # Only the bootstrap: it appends cptrace's tree at the end of sys.path itself, so the job's
    # own modules (script directory, its PYTHONPATH, site-packages) always win over ours.
    paths = [str(BOOTSTRAP_DIR), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env[STATUS_ENV] = str(scratch / "status")
    env[STEPS_ENV] = StepsConfig(out_dir=scratch / "steps", step_on=opts.step_on).to_env()
    if opts.torch:
        env[TORCH_PROFILE_ENV] = TorchProfileConfig(
            out_dir=scratch / "torch",
            wait=opts.torch_wait,
            warmup=opts.torch_warmup,
            active=opts.torch_active,
            step_on=opts.step_on,
            with_stack=opts.with_stack,
            record_shapes=opts.record_shapes,
            sync_lines=opts.sync_lines,
        ).to_env()
    else:
        env.pop(TORCH_PROFILE_ENV, None)
    if opts.probe:
        env[PROBE_ENV] = json.dumps(
            {"out_dir": str(scratch / "probe"), "first": opts.probe_first,
             "every": opts.probe_every}
        )
    else:
        env.pop(PROBE_ENV, None)
    return env


def _nsys_plan(opts: ProfileOptions, scratch: Path, extra: dict[str, Any]) -> NsysPlan:
    from analyzers.catalog import load_catalog  # the helper catalog: data for the trace file

    functions_json = None
    if opts.python_functions_trace:
        functions_json = scratch / "python_functions_trace.json"
        traced = nsys_cmds.write_python_functions_trace(functions_json, load_catalog().helpers)
        extra["nsys_python_functions"] = traced
        if not traced:  # TE not installed: nothing to trace, and nsys wants a non-empty list
            functions_json = None
    (scratch / "nsys").mkdir(parents=True, exist_ok=True)
    return NsysPlan(
        nsys_cmd=find_nsys(list(opts.nsys_cmd)),
        out_dir=scratch / "nsys",
        trace=opts.nsys_trace,
        functions_json=functions_json,
        capture_range=opts.capture_range,
        delay_s=opts.delay_s,
        duration_s=opts.duration_s,
        extra_args=opts.nsys_extra,
    )


def profile_command(
    cmd: list[str], opts: ProfileOptions, scratch: Path, extra: dict[str, Any]
) -> tuple[Launch, list[str]]:
    """The parsed launch and the command line to run (nsys inserted per rank)."""
    if not (opts.nsys or opts.torch or opts.probe):
        raise ProfileCommandError("nothing to do: give --nsys, --torch and/or --probe")
    launch = parse_launch(cmd, python=sys.executable)
    plan = _nsys_plan(opts, scratch, extra) if opts.nsys else None
    return launch, wrapped_command(launch, plan)


def _collect_traces(out: Path, scratch: Path, opts: ProfileOptions, log: Path) -> list[dict]:
    traces: list[dict[str, Any]] = []
    for path in sorted((scratch / "torch").glob("kineto_rank*.json")):
        rank = int(path.stem.removeprefix("kineto_rank"))
        member = bundle_writer.add_trace(out, bundle_writer.gzip_file(path))
        traces.append(bundle_writer.trace_entry(member, fmt="kineto", rank=rank))
    if opts.nsys and not traces:  # analysis takes Kineto or nsys, never both for one rank
        traces += _export_nsys(out, scratch, opts, log)
    return traces


def _export_nsys(out: Path, scratch: Path, opts: ProfileOptions, log: Path) -> list[dict]:
    traces = []
    for rep in sorted((scratch / "nsys").glob("nsys_rank*_pid*.nsys-rep")):
        m = _NSYS_REPORT.match(rep.name.removesuffix(".nsys-rep"))
        rank = int(m["rank"]) if m and m["rank"] else 0
        sqlite = rep.with_suffix(".sqlite")
        export = nsys_cmds.export_command(list(opts.nsys_cmd), report=rep, sqlite=sqlite)
        base = os.environ if opts.env is None else opts.env  # never the agent's credentials
        done = supervise(export, log=log, env=dict(base), timeout_s=opts.timeout_s)
        if not done.ok or not sqlite.is_file():
            continue  # the failure record and the log say the export failed
        gz = bundle_writer.gzip_file(sqlite)
        member = bundle_writer.add_trace(out, gz, name=f"{rep.stem}.sqlite.gz")
        traces.append(bundle_writer.trace_entry(member, fmt="nsys", rank=rank))
    return traces


def _scrubbed(record: dict[str, Any] | None, cmd: list[str]) -> dict[str, Any] | None:
    """The failure record without the secret values of the command line (a job that prints its
    arguments, an exception message quoting one), as the recorded command line is."""
    secrets = secret_values(cmd)
    if record is None or not secrets:
        return record
    escaped = [json.dumps(s)[1:-1] for s in secrets]
    return dict(json.loads(scrub(json.dumps(record), escaped)))


def _run_name(opts: ProfileOptions, launch: Launch) -> str:
    if opts.name:
        return opts.name
    program = next((a for a in launch.program[1:] if not a.startswith("-")), launch.program[0])
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(program).stem).strip("-.") or "job"
    return f"profile-{stem}"[:120]


def profile_job(cmd: list[str], out: Path, opts: ProfileOptions) -> ProfileResult:
    """Run ``cmd`` profiled and write the bundle at ``out`` (also when the job fails).

    :raises ProfileCommandError: the command or the options cannot work (nsys missing, ...).
    :raises FileExistsError: ``out`` exists and is not empty.
    :raises ProfileError: the job ended cleanly but nothing was captured.
    """
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; pick a new --out")
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".cptrace-profile-", dir=out.parent))
    try:
        extra: dict[str, Any] = {}
        launch, command = profile_command(cmd, opts, scratch, extra)
        log = out / "logs" / "profile.log"
        env = child_environment(opts, scratch)
        if opts.sandbox is not None:
            writable = [out, scratch, *([opts.cwd] if opts.cwd is not None else [])]
            command = opts.sandbox.wrap(command, writable=writable, cwd=opts.cwd)
        result = supervise(
            command, log=log, env=env, status_dir=scratch / "status",
            watchdog_s=opts.watchdog_s, hang_s=opts.hang_timeout_s, timeout_s=opts.timeout_s,
            cancel=opts.cancel, cwd=opts.cwd, echo=opts.echo,
        )
        if opts.sandbox is not None:  # what the job wrote is read out here: no planted links
            remove_special_files(out, scratch)
        failure = _scrubbed(failure_record(result, watchdog_s=opts.watchdog_s), cmd)
        traces = _collect_traces(out, scratch, opts, log)
        if not traces and failure is None:
            raise ProfileError(
                f"the job exited cleanly but no trace was captured (log: {log}). With --torch "
                "the steps are optimizer.step calls: give --step-function MODULE:FUNC if the job "
                "has none, or lower --torch-wait/--torch-warmup"
            )
        times = _finalize(out, scratch, cmd, opts, launch, result, failure, traces, extra)
        return ProfileResult(out, result, failure, traces, times)
    except BaseException:
        # Leave the logs for diagnosis, but never a manifest the reader would refuse.
        (out / MANIFEST_NAME).unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _finalize(
    out: Path,
    scratch: Path,
    cmd: list[str],
    opts: ProfileOptions,
    launch: Launch,
    result: Supervised,
    failure: dict[str, Any] | None,
    traces: list[dict[str, Any]],
    extra: dict[str, Any],
) -> dict[int, list[float]]:
    probes = read_probe_files(scratch / "probe")
    observed = observed_facts(probes) if probes else None
    if opts.probe and opts.echo is not None and observed is None:
        notes = sorted({str(r.get("note") or NO_CALL) for r in probes.values()} or {NO_CALL})
        opts.echo("".join(f"cptrace: --probe: {n}\n" for n in notes))
    times, step_summary = iteration_times(read_step_files(scratch / "steps"), opts.time_warmup)
    environment = capture_environment(include_hostname=opts.include_hostname)
    ranks = sorted(set(result.statuses) | set(probes))
    environment["world_size"] = len(ranks) or None
    redacted = redact_argv(cmd)
    own_options = redact_argv(options_argv(opts))
    settings = {
        "profilers": [n for n, on in (("nsys", opts.nsys), ("torch", opts.torch)) if on],
        "probe": opts.probe,
        "launcher": launch.kind,
        "watchdog_s": opts.watchdog_s,
        "hang_timeout_s": opts.hang_timeout_s,
        "step_on": opts.step_on,
        "time_warmup": opts.time_warmup,
        "torch_schedule": {"wait": opts.torch_wait, "warmup": opts.torch_warmup,
                           "active": opts.torch_active, "step_on": opts.step_on}
        if opts.torch else None,
        "nsys_capture": ("cudaProfilerApi" if opts.capture_range else
                         {"delay_s": opts.delay_s, "duration_s": opts.duration_s})
        if opts.nsys else None,
    }
    run = bundle_writer.run_info(
        name=_run_name(opts, launch),
        spec={"profile": settings, "command": redacted},
        host=socket.gethostname() if opts.include_hostname else None,
        command=shlex.join(["cptrace", "profile", *own_options, "--", *redacted]),
        exit_status=result.returncode,
        wall_s=result.wall_s,
        **(opts.run_tags or {}),
    )
    variants = []
    workload: dict[str, Any] = {} if observed is None else observed["workload"]
    if observed is not None or times:
        # No window: the variant is the whole job, and its timed steps are the trace's steps.
        variants.append({
            "name": "profiled",
            "window": None,
            "facts": {} if observed is None else observed["facts"],
            "iteration_ms": {str(r): v for r, v in sorted(times.items())},
        })
    extra["step_times"] = step_summary
    sync_lines = read_sync_files(scratch / "torch")
    if sync_lines:
        extra["sync_lines"] = sync_lines
    if probes:
        extra["probe"] = {str(r): probes[r] for r in sorted(probes)}
    if failure is not None:
        extra["failure"] = failure
    bundle_writer.finalize_bundle(
        out, run=run, traces=traces, workload=workload, variants=variants,
        environment=environment, extra=extra,
    )
    return times
