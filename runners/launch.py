"""``cptrace run``: launch a spec on N processes, profile it, and assemble a run bundle.

One process per GPU. Launchers:

* ``torchrun`` (``python -m torch.distributed.run --standalone``): the default.
* ``srun``: picked automatically inside a Slurm allocation (``SLURM_JOB_ID`` set); ranks read
  ``SLURM_PROCID``/``SLURM_NTASKS`` (see ``runners/workload.py``).
* ``fork`` (``runners/forkrun.py``): picked automatically for ``device: cpu`` specs outside
  Slurm; one process imports torch and forks the gloo ranks from it, where torchrun would pay
  the import once for itself and once per rank.

Profilers never share a process: Kineto and nsys both subscribe to CUPTI, so ``mode: both``
makes two launches (timed + Kineto, then nsys around the profiled steps only). The bundle is
written into ``out`` and checked with the same reader the service uses.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzers.bundle import MANIFEST_NAME
from runners import bundle as bundle_writer
from runners import nsys as nsys_cmds
from runners.manifest import build_manifest_parts
from runners.profile.rankstatus import STATUS_ENV
from runners.profile.supervise import Supervised, failure_record, supervise
from runners.sandbox import Sandbox
from runners.spec import RunSpec, parse_spec

REPO_ROOT = Path(__file__).resolve().parent.parent


class LaunchError(RuntimeError):
    """A launch failed; the message carries the command's exit status and its log tail."""

    def __init__(
        self, message: str, *, log_tail: str = "", supervised: Supervised | None = None
    ) -> None:
        super().__init__(f"{message}\n--- log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail
        self.supervised = supervised
        """How the launch ended (ranks' statuses, watchdog), when it was started at all."""
        self.bundle: Path | None = None
        """The bundle written with the failure record, if one could be written."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchOptions:
    """How to start the ranks (everything the spec does not say)."""

    nproc: int | None = None
    """Processes; None = the spec's ``ranks``."""
    launcher: str = "auto"
    """``auto`` (srun inside Slurm, else fork for a CPU spec, else torchrun), ``torchrun``,
    ``srun`` or ``fork``."""
    nsys_cmd: tuple[str, ...] = ("nsys",)
    """How to call Nsight Systems (e.g. ``.gpu/gpu-host/nsys.sh .gpu/debs``)."""
    timeout_s: float | None = None
    """Kill a launch that runs longer than this."""
    include_hostname: bool = False
    cancel: threading.Event | None = None
    """Set to stop the launch (the agent's SIGTERM/lease-lost path)."""
    run_tags: dict[str, Any] | None = None
    """Manifest ``run`` fields that replace the runner checkout's own git facts (the agent's
    pull-request jobs: branch, commit, repo, pr, suite, spec_name of the measured checkout)."""
    sandbox: Sandbox | None = None
    """The agent's sandbox: a command entry (pull-request code) runs inside it."""


LAUNCHERS = ("auto", "torchrun", "srun", "fork")


def resolve_launcher(
    requested: str, environ: dict[str, str] | None = None, *, cpu: bool = False
) -> str:
    """The launcher to use: an explicit choice, else srun inside a Slurm job, else fork for a
    CPU spec (``cpu``: one host, no CUDA context a fork could copy), else torchrun."""
    env = os.environ if environ is None else environ
    if requested not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {requested!r}")
    if requested != "auto":
        return requested
    if env.get("SLURM_JOB_ID") and shutil.which("srun"):
        return "srun"
    return "fork" if cpu else "torchrun"


def rank_command(spec_json: Path, scratch: Path, phases: list[str]) -> list[str]:
    """The per-rank module invocation (after the launcher's own arguments)."""
    return [
        "-m",
        "runners.workload",
        "--spec",
        str(spec_json),
        "--out",
        str(scratch),
        "--phases",
        ",".join(phases),
    ]


def launcher_command(launcher: str, nproc: int, per_rank: list[str]) -> list[str]:
    """Start ``nproc`` ranks running ``python <per_rank>``."""
    if launcher == "srun":
        return ["srun", f"--ntasks={nproc}", "--kill-on-bad-exit=1", sys.executable, *per_rank]
    if launcher == "fork":
        return [sys.executable, "-m", "runners.forkrun", f"--nproc={nproc}", *per_rank]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *per_rank,
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_env(launcher: str) -> dict[str, str]:
    """The ranks' environment. They run cptrace's own code only (``-m runners.workload``), so
    cptrace's modules must win: the tree goes first on ``PYTHONPATH``, and ``PYTHONSAFEPATH``
    keeps ``-m`` from putting the working directory before it (a user's project with its own
    ``runners`` or ``contracts`` package, where ``cptrace run`` is started, would shadow ours).
    ``cptrace profile`` is the opposite case: its children run the user's code, and the user's
    modules win there (``runners/profile/bootstrap/sitecustomize.py``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONSAFEPATH"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if launcher == "srun":  # torchrun sets these itself
        env.setdefault("MASTER_ADDR", env.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"))
        env.setdefault("MASTER_PORT", str(_free_port()))
    return env


def run_logged(
    cmd: list[str],
    *,
    log: Path,
    env: dict[str, str],
    timeout: float | None,
    cancel: threading.Event | None = None,
    status_dir: Path | None = None,
    watchdog_s: float | None = None,
    cwd: Path | None = None,
) -> Supervised:
    """Run ``cmd`` with its output in ``log``; raise ``LaunchError`` with the tail on failure.

    The command gets its own process group so a timeout, ``cancel`` or the watchdog stops every
    rank, not just the launcher. With ``status_dir`` the ranks' status files are watched: once
    one reports an exception the rest get ``watchdog_s`` seconds, then the group is stopped.
    """
    result = supervise(
        cmd, log=log, env=env, status_dir=status_dir, watchdog_s=watchdog_s,
        timeout_s=timeout, cancel=cancel, stop_grace_s=15.0, cwd=cwd,
    )
    if result.start_error:
        raise LaunchError(result.start_error, supervised=result)
    if result.cancelled:
        raise LaunchError(f"{cmd[0]} cancelled", log_tail=result.tail(), supervised=result)
    if result.timed_out:
        raise LaunchError(f"{cmd[0]} ran over {timeout} s", log_tail=result.tail(),
                          supervised=result)
    if result.returncode != 0 or result.first_failure is not None:
        record = failure_record(result, watchdog_s=watchdog_s)
        why = f": {record['summary']}" if record and result.first_failure else ""
        raise LaunchError(
            f"{shlex.join(cmd[:6])} ... exited with status {result.returncode}{why}",
            log_tail=result.tail(),
            supervised=result,
        )
    return result


def _with_ranks(spec: RunSpec, nproc: int | None) -> RunSpec:
    if nproc is None or nproc == spec.ranks:
        return spec
    return parse_spec({**spec.model_dump(mode="json"), "ranks": nproc}, source="--nproc")


def _read_results(scratch: Path) -> list[dict[str, Any]]:
    return [
        json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((scratch / "results").glob("rank*.json"))
    ]


def run_spec(spec: RunSpec, out: Path, options: LaunchOptions | None = None) -> Path:
    """Run ``spec`` and write a finalized bundle directory at ``out``; return ``out``.

    :raises LaunchError: a launch or the nsys export failed (with the log tail).
    :raises FileExistsError: ``out`` exists and is not empty (runs never overwrite runs).
    """
    opts = options or LaunchOptions()
    spec = _with_ranks(spec, opts.nproc)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; pick a new --out")
    launcher = resolve_launcher(opts.launcher, cpu=spec.device == "cpu")
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".cptrace-run-", dir=out.parent))
    try:
        spec_json = scratch / "spec.json"
        spec_json.write_text(spec.model_dump_json(), encoding="utf-8")
        env = _child_env(launcher)
        env[STATUS_ENV] = str(scratch / "status")
        try:
            traces, extra = _launch_all(spec, out, scratch, spec_json, launcher, env, opts)
        except LaunchError as exc:
            exc.bundle = _failure_bundle(spec, out, scratch, launcher, opts, exc)
            raise
        parts = build_manifest_parts(spec, _read_results(scratch))
        run = _run_info(spec, launcher, opts)
        bundle_writer.finalize_bundle(
            out, run=run, traces=traces, extra={**parts.extra, **extra}, **parts.fields
        )
    except LaunchError as exc:
        if exc.bundle is None:  # logs stay for diagnosis; a manifest only with the failure
            (out / MANIFEST_NAME).unlink(missing_ok=True)
        raise
    except BaseException:
        # Leave logs for diagnosis, but never a manifest that claims a complete run.
        (out / MANIFEST_NAME).unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def _run_info(spec: RunSpec, launcher: str, opts: LaunchOptions) -> dict[str, Any]:
    started = " ".join(["cptrace", "run", f"--nproc {spec.ranks}", f"--launcher {launcher}"])
    return bundle_writer.run_info(
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        host=socket.gethostname() if opts.include_hostname else None,
        command=started,
        **(_git_info() if opts.run_tags is None else opts.run_tags),
    )


def _kineto_traces(out: Path, scratch: Path) -> list[dict[str, Any]]:
    traces = []
    for path in sorted((scratch / "traces").glob("kineto_rank*.json")):
        rank = int(path.stem.removeprefix("kineto_rank"))
        member = bundle_writer.add_trace(out, bundle_writer.gzip_file(path))
        traces.append(bundle_writer.trace_entry(member, fmt="kineto", rank=rank))
    return traces


def _failure_bundle(
    spec: RunSpec, out: Path, scratch: Path, launcher: str, opts: LaunchOptions,
    exc: LaunchError,
) -> Path | None:
    """The bundle of a failed launch: what was captured, the spec's facts, the failure record.

    Returns None (no bundle) when the launch never started a rank: there is nothing to record.
    """
    result = exc.supervised
    if result is None or result.start_error:
        return None
    failure = failure_record(result, watchdog_s=spec.watchdog_s) or {
        "summary": str(exc).splitlines()[0], "exit_status": result.returncode,
    }
    parts = build_manifest_parts(spec, _read_results(scratch))
    bundle_writer.finalize_bundle(
        out,
        run={**_run_info(spec, launcher, opts), "exit_status": result.returncode},
        traces=_kineto_traces(out, scratch),
        extra={**parts.extra, "failure": failure},
        **parts.fields,
    )
    return out


def _launch_all(
    spec: RunSpec,
    out: Path,
    scratch: Path,
    spec_json: Path,
    launcher: str,
    env: dict[str, str],
    opts: LaunchOptions,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the launches the profiler mode needs; return trace entries and manifest extras."""
    mode = spec.profilers.mode
    traces: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    first = ["timed", "torch"] if spec.profilers.uses_torch else ["timed"]
    if mode == "nsys":
        first = ["timed", "nsys"]
    second = ["nsys"] if mode == "both" else None
    for phases in filter(None, (first, second)):
        per_rank = rank_command(spec_json, scratch, phases)
        cmd = launcher_command(launcher, spec.ranks, per_rank)
        log = out / "logs" / f"launch-{'-'.join(phases)}.log"
        if "nsys" in phases:
            traces.append(_run_nsys(spec, out, scratch, cmd, log, env, opts, extra))
        else:
            run_logged(
                cmd, log=log, env=env, timeout=opts.timeout_s, cancel=opts.cancel,
                status_dir=scratch / "status", watchdog_s=spec.watchdog_s,
            )
    if spec.profilers.uses_torch:
        traces += _kineto_traces(out, scratch)
    return traces, extra


def _run_nsys(
    spec: RunSpec,
    out: Path,
    scratch: Path,
    cmd: list[str],
    log: Path,
    env: dict[str, str],
    opts: LaunchOptions,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Wrap the launch in ``nsys profile``, export to SQLite, gzip it into the bundle."""
    from analyzers.catalog import load_catalog  # the helper catalog: data for the trace file

    functions_json = None
    if spec.profilers.nsys.python_functions_trace:
        functions_json = scratch / "python_functions_trace.json"
        traced = nsys_cmds.write_python_functions_trace(functions_json, load_catalog().helpers)
        extra["nsys_python_functions"] = traced
        if not traced:  # TE not installed: nothing to trace, and nsys wants a non-empty list
            functions_json = None
    report = scratch / "nsys_report"
    profile = nsys_cmds.profile_command(
        list(opts.nsys_cmd),
        output=report,
        trace=spec.profilers.nsys.trace,
        functions_json=functions_json,
        extra_args=spec.profilers.nsys.extra_args,
    )
    run_logged(
        [*profile, *cmd], log=log, env=env, timeout=opts.timeout_s, cancel=opts.cancel,
        status_dir=scratch / "status", watchdog_s=spec.watchdog_s,
    )
    rep = report.with_suffix(".nsys-rep")
    sqlite = scratch / "nsys.sqlite"
    export = nsys_cmds.export_command(list(opts.nsys_cmd), report=rep, sqlite=sqlite)
    run_logged(export, log=log, env=env, timeout=opts.timeout_s, cancel=opts.cancel)
    member = bundle_writer.add_trace(out, bundle_writer.gzip_file(sqlite))
    return bundle_writer.trace_entry(member, fmt="nsys", rank=None)


def _git_info() -> dict[str, str | None]:
    """Branch and commit of the checkout the runner runs from (best effort, read-only)."""
    info: dict[str, str | None] = {"branch": None, "commit": None}
    for key, args in (("commit", ["rev-parse", "HEAD"]), ("branch", ["branch", "--show-current"])):
        try:
            res = subprocess.run(
                ["git", "-C", str(REPO_ROOT), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if res.returncode == 0 and res.stdout.strip():
            info[key] = res.stdout.strip()
    return info


def default_out_dir(spec: RunSpec, base: Path = Path("runs")) -> Path:
    """``runs/<name>-<UTC time>``: unique per run, sortable by time."""
    return base / f"{spec.name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
