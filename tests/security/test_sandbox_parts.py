"""The sandbox's parts on their own: a token file readable by others is refused, ``--token``
on the command line is refused, links planted by a job are removed before the agent reads its
output, and redaction hides a part of a cptrace token too (issue 24, item 1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from contracts.redaction import REDACTED, redact_secrets
from runners.sandbox import Sandbox, SandboxError, read_token_file, remove_special_files


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("cpt_" + "s" * 43)
    token.chmod(0o644)
    with pytest.raises(SandboxError, match="chmod 600"):
        read_token_file(token)
    token.chmod(0o600)
    assert read_token_file(token) == "cpt_" + "s" * 43


def test_the_agent_refuses_a_token_on_its_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from cptrace.cli import main; main()", "agent",
         "--server", "http://127.0.0.1:9", "--token", "cpt_" + "x" * 43],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "no token on the command line" in done.stderr


def test_links_and_fifos_a_job_planted_are_removed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("cpt_" + "z" * 43)
    out = tmp_path / "out" / "torch"
    out.mkdir(parents=True)
    (out / "kineto_rank0.json").symlink_to(secret)
    os.mkfifo(out / "pipe")
    (out / "real.json").write_text("{}")
    removed = remove_special_files(tmp_path / "out")
    assert sorted(p.name for p in removed) == ["kineto_rank0.json", "pipe"]
    assert [p.name for p in out.iterdir()] == ["real.json"] and secret.exists()


def test_a_token_is_hidden_in_the_sandbox_and_the_job_sees_no_host_process(
    tmp_path: Path,
) -> None:
    token = tmp_path / "hidden" / "token"
    token.parent.mkdir()
    token.write_text("cpt_" + "h" * 43)
    work = tmp_path / "work"
    work.mkdir()
    argv = Sandbox(hidden=(token.parent,)).wrap(
        ["sh", "-c", f"cat {token} || echo gone; ls /proc | grep -c '^[0-9]'; touch /etc/x"],
        writable=[work], cwd=work,
    )  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    lines = done.stdout.split()
    assert lines[0] == "gone" and int(lines[1]) < 5, done.stdout + done.stderr
    assert "Read-only file system" in done.stderr


def test_redaction_hides_a_part_of_a_cptrace_token() -> None:
    text = "invalid JSON trace: unexpected 'cpt_abcdefghijklmnop'"
    assert redact_secrets(text) == f"invalid JSON trace: unexpected '{REDACTED}'"


def test_tools_on_path_under_tmp_stay_visible_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent whose venv (``torchrun``, ``python``) lives under ``/tmp``: the sandbox's own
    ``/tmp`` would hide it and the job would not start (``execvp torchrun``). Its ``PATH``
    directories are bound back read-only; the rest of the host's ``/tmp`` stays out of sight."""
    host_tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="cptrace-tools-"))  # what it is about
    try:
        tools = host_tmp / "venv" / "bin"
        tools.mkdir(parents=True)
        marker = tools / "cptrace-marker"
        marker.write_text("#!/bin/sh\necho marker-ok\n")
        marker.chmod(0o755)
        other = host_tmp / "other.txt"
        other.write_text("host file")
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
        script = (
            f"cptrace-marker; cat {other} 2>/dev/null || echo other-hidden; "
            f"touch {tools}/x 2>/dev/null && echo writable || echo read-only"
        )
        argv = Sandbox().wrap(["sh", "-c", script], writable=[work], cwd=work)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    finally:
        shutil.rmtree(host_tmp)
    assert done.stdout.split() == ["marker-ok", "other-hidden", "read-only"], (
        done.stdout + done.stderr
    )
