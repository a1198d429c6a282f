"""Command lines of ``cptrace profile``: the user's command, rewritten to profile each process.

nsys wrapped around ``torchrun`` would write one report for the whole process tree; cptrace wants
one report per rank, so nsys goes *inside* the launcher: ``torchrun [opts] --no-python nsys
profile ... python SCRIPT``, ``srun [opts] nsys profile ... CMD``, and plain ``nsys profile ...
CMD`` for a single process. The report name carries the rank (``%q{RANK}`` under torchrun,
``%q{SLURM_PROCID}`` under srun) and the process id (``%p``).

The secrets rule: the command line recorded in the manifest goes through :func:`redact_argv`
(values of ``--token``/``--password``/``--api-key``-like options and ``KEY=secret`` pairs are
replaced), and environment variables are never recorded.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from runners import nsys as nsys_cmds

NSYS_INSTALL_HINT = (
    "Nsight Systems (nsys) was not found. Install it from "
    "https://developer.nvidia.com/nsight-systems (or the CUDA toolkit's nsight-systems package), "
    "pass its path with --nsys-cmd, or profile with --torch instead"
)
_TORCHRUN_FLAGS = frozenset(
    {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module"}
)
_SRUN_FLAGS = frozenset(
    {"--exclusive", "--overcommit", "-O", "--pty", "-u", "--unbuffered", "-l", "--label", "-v",
     "--verbose", "-Q", "--quiet", "-K", "--kill-on-bad-exit", "-X", "--disable-status"}
)
_SECRET_OPTION = re.compile(r"(token|password|passwd|secret|api[-_]?key|credential)", re.I)
REDACTED = "***"
MIN_SECRET_CHARS = 4
"""Shorter values are not scrubbed from text (a 1-character secret would blank every letter)."""


class ProfileCommandError(ValueError):
    """The command cannot be profiled as given (the message says what to change)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """How the user's command starts its ranks."""

    kind: str
    """``torchrun``, ``srun`` or ``single``."""
    launcher: list[str]
    """The launcher and its options (empty for ``single``)."""
    program: list[str]
    """What each rank runs (``python SCRIPT ARGS`` / the executable and its arguments)."""


def _is_python(arg: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(arg)) is not None


def _split_options(args: list[str], flags: frozenset[str], launcher: str) -> int:
    """Index of the first positional argument after a launcher's options."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return i + 1
        if not arg.startswith("-"):
            return i
        if "=" in arg or arg in flags:
            i += 1
        else:
            i += 2  # an option with its value as the next argument
    raise ProfileCommandError(
        f"{launcher} {' '.join(args)}: no program after the launcher's options (options that "
        "take a value must be written --option=value or --option value)"
    )


def parse_launch(cmd: list[str], *, python: str) -> Launch:
    """Recognize torchrun (console script or ``python -m torch.distributed.run``) and srun."""
    if not cmd:
        raise ProfileCommandError("no command given: cptrace profile [OPTIONS] -- CMD [ARGS...]")
    head = os.path.basename(cmd[0])
    if head == "torchrun" or (
        _is_python(cmd[0]) and cmd[1:3] in (["-m", "torch.distributed.run"],
                                            ["-m", "torch.distributed.launch"])
    ):
        start = 1 if head == "torchrun" else 3
        opts_end = start + _split_options(cmd[start:], _TORCHRUN_FLAGS, "torchrun")
        options = cmd[start:opts_end]
        rest = cmd[opts_end:]
        no_python = any(o in ("--no-python", "--no_python") for o in options)
        module = any(o in ("-m", "--module") for o in options)
        kept = [o for o in options if o not in ("--no-python", "--no_python", "-m", "--module")]
        program = rest if no_python else [python, *(["-m"] if module else []), *rest]
        return Launch("torchrun", [*cmd[:start], *kept, "--no-python"], program)
    if head == "srun":
        opts_end = 1 + _split_options(cmd[1:], _SRUN_FLAGS, "srun")
        return Launch("srun", cmd[:opts_end], cmd[opts_end:])
    return Launch("single", [], list(cmd))


def report_name(out_dir: Path, launch: Launch) -> Path:
    """nsys ``-o`` with the rank and pid placeholders nsys expands per process."""
    rank = {"torchrun": "%q{RANK}", "srun": "%q{SLURM_PROCID}", "single": "0"}[launch.kind]
    return out_dir / f"nsys_rank{rank}_pid%p"


def find_nsys(nsys_cmd: list[str]) -> list[str]:
    """The nsys invocation, checked to exist. :raises ProfileCommandError: with the hint."""
    if not nsys_cmd:
        raise ProfileCommandError(NSYS_INSTALL_HINT)
    exe = nsys_cmd[0]
    if os.sep in exe:
        if not (Path(exe).is_file() and os.access(exe, os.X_OK)):
            raise ProfileCommandError(f"{exe}: not an executable file. {NSYS_INSTALL_HINT}")
        return nsys_cmd
    if shutil.which(exe) is None:
        raise ProfileCommandError(f"{exe}: not on PATH. {NSYS_INSTALL_HINT}")
    return nsys_cmd


@dataclass(frozen=True, slots=True, kw_only=True)
class NsysPlan:
    """What ``--nsys`` needs beyond the binary."""

    nsys_cmd: list[str]
    out_dir: Path
    trace: str = "cuda,nvtx"
    functions_json: Path | None = None
    capture_range: bool = False
    """``--capture-range=cudaProfilerApi``: the job brackets its steps itself
    (``cudaProfilerStart/Stop``)."""
    delay_s: float | None = None
    duration_s: float | None = None
    extra_args: tuple[str, ...] = ()


def nsys_profile_args(plan: NsysPlan, launch: Launch) -> list[str]:
    """``nsys profile ...`` for one rank (the rank's program is appended after it)."""
    args = nsys_cmds.profile_command(
        list(plan.nsys_cmd),
        output=report_name(plan.out_dir, launch),
        trace=plan.trace,
        functions_json=plan.functions_json,
        extra_args=[],
        capture_range=plan.capture_range,
    )
    if not plan.capture_range:
        if plan.delay_s is not None:
            args.append(f"--delay={plan.delay_s:g}")
        if plan.duration_s is not None:
            args.append(f"--duration={plan.duration_s:g}")
    return [*args, *plan.extra_args]


def wrapped_command(launch: Launch, nsys: NsysPlan | None) -> list[str]:
    """The command ``cptrace profile`` really runs."""
    if nsys is None:
        return [*launch.launcher, *launch.program]
    return [*launch.launcher, *nsys_profile_args(nsys, launch), *launch.program]


def secret_values(argv: list[str]) -> list[str]:
    """The values :func:`redact_argv` hides (to scrub them from text the job printed too)."""
    hidden = []
    for arg, shown in zip(argv, redact_argv(argv), strict=True):
        if arg != shown:
            hidden.append(arg.partition("=")[2] if shown.endswith(f"={REDACTED}") else arg)
    return hidden


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every value of ``secrets`` (longest first) replaced by ``***``."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len,
                         reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with secret-looking option values and ``KEY=value`` secrets hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _value = arg.partition("=")
        if _SECRET_OPTION.search(name) and (eq or name.startswith("-")):
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out
