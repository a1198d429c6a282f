"""The sandbox that pull-request code runs in on a runner host (bubblewrap, from Debian).

A job's setup command and its command entry are the pull request's code. Removing the agent's
credentials from their environment is not enough: a process of the same uid reads
``/proc/<agent pid>/environ`` and ``cmdline``, and the agent's files. So that code runs under
``bwrap`` with:

* new user, pid, ipc, uts and cgroup namespaces (``--unshare-all``; the network is kept, so a
  setup command can install packages): no process of the host is visible, its own ``/proc``;
  every capability dropped, a new session (no terminal injection), killed with the agent;
* the host's file system read-only, a private ``/tmp`` and ``/dev/shm``, the GPUs' device
  nodes (``/dev/nvidia*``) and nothing else under ``/dev``; the agent's Python, the
  directories on its ``PATH`` and the folder cptrace's packages are imported from stay visible
  (read-only) even where they live under ``/tmp``, so ``python``, ``torchrun``, ``cptrace`` and
  ``cp_attention`` resolve in the job as they do for the agent (an editable install's sources
  are outside the venv);
* the agent's token file, its work directory (other jobs' files) and the usual credential
  files (``~/.ssh``, ``~/.netrc``, ``~/.git-credentials``, ``~/.config/gh``, ``~/.aws``,
  ``~/.docker``, ``/etc/shadow``; plus ``Sandbox.hidden``) replaced by empty ones;
* writable: only this job's checkout (also its ``HOME``), its bundle directory and its scratch
  directory; a setup command installs into the checkout (``pip install --user``, a venv there),
  never into the host's Python.

Fail closed: :func:`check_sandbox` starts the sandbox once when the agent starts and raises
:class:`SandboxError` (the agent refuses to run) when it cannot.
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CREDENTIAL_PATHS = (
    "~/.ssh",
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/gh",
    "~/.config/git/credentials",
    "~/.aws",
    "~/.docker",
    "~/.pypirc",
    "/etc/shadow",
    "/etc/gshadow",
)
"""Hidden in every sandbox when they exist (a runner host's usual secrets)."""
_PR_SET_DUMPABLE = 4


class SandboxError(RuntimeError):
    """The sandbox cannot start on this host (the agent refuses to run pull-request code)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sandbox:
    """How the agent confines a job's commands (see the module docstring)."""

    hidden: tuple[Path, ...] = ()
    """More files or directories to hide (the agent adds its token file and work dir)."""
    bwrap: str = "bwrap"
    devices: tuple[str, ...] = ("/dev/nvidia*",)
    """Device nodes bound in (globs); none match on a CPU host."""
    credential_paths: tuple[str, ...] = field(default=CREDENTIAL_PATHS)

    def _hidden(self) -> list[Path]:
        found = [Path(os.path.expanduser(p)) for p in self.credential_paths]
        return [p for p in (*found, *self.hidden) if os.path.lexists(p)]

    def wrap(self, argv: Sequence[str], *, writable: Iterable[Path], cwd: Path | None) -> list[str]:
        """``argv`` run inside the sandbox, with only ``writable`` writable, started in ``cwd``.

        :raises SandboxError: bwrap is not installed.
        """
        binary = shutil.which(self.bwrap)
        if binary is None:
            raise SandboxError(
                f"{self.bwrap!r} is not installed: the agent runs pull-request code only in its "
                "sandbox (Debian: apt-get install bubblewrap)"
            )
        cmd = [binary, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        cmd += ["--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
        for tool_dir in _tool_dirs_under_private_mounts():  # before the hiding below
            cmd += ["--ro-bind", tool_dir, tool_dir]
        for pattern in self.devices:
            for node in sorted(glob.glob(pattern)):
                cmd += ["--dev-bind", node, node]
        for path in self._hidden():
            target = str(path.resolve())
            if path.is_dir():
                cmd += ["--tmpfs", target]
            else:
                cmd += ["--ro-bind", "/dev/null", target]
        for path in writable:  # after the hiding: a job's dirs live inside the hidden work dir
            resolved = str(Path(path).resolve())
            cmd += ["--bind", resolved, resolved]
        cmd += ["--unshare-all", "--share-net", "--die-with-parent", "--new-session"]
        cmd += ["--cap-drop", "ALL"]
        if cwd is not None:  # HOME too: ``pip install --user`` and caches land in the checkout
            home = str(Path(cwd).resolve())
            cmd += ["--chdir", home, "--setenv", "HOME", home]
        return [*cmd, "--", *argv]


PRIVATE_MOUNTS = ("/tmp", "/dev/shm")
"""Where the sandbox mounts empty file systems of its own."""


_PACKAGES_ROOT = str(Path(__file__).resolve().parents[1])
"""The folder holding cptrace's packages (``runners`` beside ``cptrace``, ``cp_attention``...):
the checkout for an editable install, ``site-packages`` for a wheel."""


def _tool_dirs_under_private_mounts() -> list[str]:
    """The agent's Python prefixes, ``PATH`` directories and packages folder that a private
    mount would cover (an agent installed in a venv under ``/tmp``): bound back read-only."""
    found: list[str] = []
    path = os.environ.get("PATH", "").split(os.pathsep)
    for raw in (sys.prefix, sys.base_prefix, _PACKAGES_ROOT, *path):
        if not raw or not os.path.isdir(raw):
            continue
        resolved = str(Path(raw).resolve())
        under = any(resolved.startswith(mount + os.sep) for mount in PRIVATE_MOUNTS)
        if under and resolved not in found:
            found.append(resolved)
    return found


def check_sandbox(sandbox: Sandbox, scratch: Path) -> None:
    """Start the sandbox once (``true`` in it, ``scratch`` writable).

    :raises SandboxError: it cannot start here (the reason bwrap gave).
    """
    scratch.mkdir(parents=True, exist_ok=True)
    probe = scratch / ".cptrace-sandbox-probe"
    argv = ["/bin/sh", "-c", f"echo ok > {probe}"]
    try:
        done = subprocess.run(
            sandbox.wrap(argv, writable=[scratch], cwd=scratch),
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"the job sandbox cannot start: {exc}") from exc
    ok = probe.is_file()
    probe.unlink(missing_ok=True)
    if done.returncode != 0 or not ok:
        why = (done.stderr or done.stdout).strip()[-500:] or f"exit status {done.returncode}"
        raise SandboxError(f"the job sandbox cannot start: {why}")


def make_undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: no core dump, and ``/proc/<pid>/environ``, ``mem`` and
    ptrace of this process are closed to other processes of its uid.

    :raises SandboxError: the call failed (not Linux, or refused).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
    except (OSError, AttributeError) as exc:
        raise SandboxError(f"prctl(PR_SET_DUMPABLE) is not available: {exc}") from exc
    if failed:
        raise SandboxError(f"prctl(PR_SET_DUMPABLE, 0) failed: errno {ctypes.get_errno()}")


def read_token_file(path: Path) -> str:
    """The token in ``path``, which only its owner may read (mode 0600 or stricter).

    :raises SandboxError: unreadable, empty, or readable by the group or others.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SandboxError(f"token file {path}: cannot read it ({exc.strerror})") from exc
    if mode & 0o077:
        raise SandboxError(
            f"token file {path}: mode {mode & 0o777:o} lets other users read it; chmod 600 it"
        )
    if not text:
        raise SandboxError(f"token file {path}: empty")
    return text


def remove_special_files(*roots: Path) -> list[Path]:
    """Remove every symlink and non-regular file (FIFO, socket, device) under ``roots``.

    What a sandboxed job wrote is read afterwards by the agent, outside the sandbox: a link
    planted there (``kineto_rank0.json -> /etc/cptrace/token``) would make the agent read, and
    upload, a file the job itself could not see. Returns what was removed.
    """
    removed = []
    for root in roots:
        if not root.exists():
            continue
        for path in sorted(root.rglob("*"), reverse=True):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
