"""The console script ends without the interpreter's teardown (``cptrace.cli.console_main``),
and loses nothing by it: the whole report, the exit status, the exit handlers, other threads.

Each case is a fresh interpreter running the entry point the installed ``cptrace`` script
runs (``pyproject.toml``: ``[project.scripts]``).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAIR = [str(ROOT / f"tests/data/synthetic-h200x2/kineto_rank{rank}.json.gz") for rank in (0, 1)]

_ENTRY = "from cptrace.cli import console_main; console_main()"


def _run(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_the_installed_script_is_the_fast_exit() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["cptrace"] == "cptrace.cli:console_main"


def test_the_report_and_status_are_those_of_an_ordinary_exit() -> None:
    fast = _run(_ENTRY, "analyze", *PAIR, "--json")
    ordinary = _run("from cptrace.cli import main; main()", "analyze", *PAIR, "--json")
    assert fast.returncode == ordinary.returncode == 0, fast.stderr
    assert fast.stdout == ordinary.stdout
    assert fast.stdout.rstrip().endswith("}")


def test_error_and_usage_statuses_are_kept() -> None:
    missing = _run(_ENTRY, "analyze", str(ROOT / "tests/data/no_such_trace.json"))
    assert missing.returncode == 1
    assert "Error:" in missing.stderr
    assert _run(_ENTRY, "no-such-command").returncode == 2


def test_exit_handlers_run(tmp_path: Path) -> None:
    flag = tmp_path / "handler-ran"
    code = (
        "import atexit, pathlib\n"
        f"atexit.register(pathlib.Path({str(flag)!r}).write_text, 'yes')\n"
        f"{_ENTRY}\n"
    )
    done = _run(code, "version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cptrace ")
    assert flag.read_text() == "yes"


def test_a_live_thread_gets_the_ordinary_exit_that_waits_for_it(tmp_path: Path) -> None:
    flag = tmp_path / "thread-finished"
    code = (
        "import pathlib, threading, time\n"
        "def late():\n"
        "    time.sleep(0.3)\n"
        f"    pathlib.Path({str(flag)!r}).write_text('yes')\n"
        "threading.Thread(target=late).start()\n"
        f"{_ENTRY}\n"
    )
    done = _run(code, "version")
    assert done.returncode == 0, done.stderr
    assert flag.read_text() == "yes"
