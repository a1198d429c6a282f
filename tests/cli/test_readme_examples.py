"""The README's example sessions are real: each ``$ cptrace ...`` command runs on the demo
bundles and its output holds every line the README shows for it (numbers included).

A README line matches when its text, whitespace collapsed, is part of the command's output,
whitespace collapsed (the terminal wraps long lines); a line ending in ``...`` matches as a
prefix, and a line that is just ``...`` stands for output the README leaves out.
"""

from __future__ import annotations

import re
import shlex

import pytest
from testkit import REPO_ROOT
from typer.testing import CliRunner

from cptrace.cli import app

README = REPO_ROOT / "README.md"


def console_sessions(text: str) -> list[tuple[list[str], list[str]]]:
    """(argv after ``cptrace``, the output lines shown) of each command in ``console`` blocks."""
    sessions: list[tuple[list[str], list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, re.DOTALL):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                i += 1
                continue
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            i += 1
            shown = []
            while i < len(lines) and not lines[i].startswith("$ "):
                shown.append(lines[i])
                i += 1
            argv = shlex.split(command)
            assert argv[0] == "cptrace", f"README example is not a cptrace command: {command}"
            sessions.append((argv[1:], shown))
    return sessions


def _collapse(text: str) -> str:
    return " ".join(text.split())


def missing_lines(output: str, shown: list[str]) -> list[str]:
    """The README lines that the output does not hold."""
    flat = _collapse(output)
    missing = []
    for line in shown:
        want = _collapse(line)
        if want in ("", "..."):
            continue
        if want.endswith("..."):
            want = want[:-3].rstrip()
        if want not in flat:
            missing.append(line)
    return missing


SESSIONS = console_sessions(README.read_text(encoding="utf-8"))


def test_the_readme_shows_commands_on_the_demo_bundles() -> None:
    assert len(SESSIONS) >= 2
    for argv, shown in SESSIONS:
        assert any(a.startswith("demo/bundles/") for a in argv), argv
        assert [s for s in shown if s.strip() not in ("", "...")], argv


@pytest.mark.parametrize(("argv", "shown"), SESSIONS, ids=[a[0] for a, _ in SESSIONS])
def test_readme_example_prints_what_the_readme_says(
    argv: list[str], shown: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO_ROOT)  # the README's paths are relative to the repository root
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "400"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output[-2000:]
    assert missing_lines(result.output, shown) == []


def test_a_drifted_number_is_caught() -> None:
    output = "from get_cu_seqlens_on_cp_rank -32 (disappeared,\n   host -7.40 ms), te_cp +32"
    line = "from get_cu_seqlens_on_cp_rank -32 (disappeared, host -7.40 ms),"
    assert missing_lines(output, [line]) == []
    drifted = "(disappeared, host -7.74 ms)"
    assert missing_lines(output, [drifted]) == [drifted]
    assert missing_lines(output, ["...", "te_cp +32 and more ..."]) == ["te_cp +32 and more ..."]
    assert missing_lines(output, ["te_cp ..."]) == []
