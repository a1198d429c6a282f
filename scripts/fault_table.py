"""Run the fault and abuse tests and write what they observed into docs/service.md.

Each test calls ``fault_support.record(attack, expected, observed)``; with ``CPTRACE_FAULT_LOG``
set those rows go to a file, and this script renders them as the table between the
``fault-table`` markers of docs/service.md. The observed column is what the last run measured.

    .venv/bin/python scripts/fault_table.py          # runs the tests (~3 minutes), rewrites
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "service.md"
TESTS = [
    "tests/service/test_faults.py",
    "tests/service/test_abuse.py",
    "tests/service/test_job_ownership.py",
    "tests/service/test_analysis_limits.py",
]
START, END = "<!-- fault-table:start -->", "<!-- fault-table:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[dict[str, str]]) -> str:
    lines = ["| attack | expected | observed |", "|---|---|---|"]
    lines += [
        f"| {_cell(r['attack'])} | {_cell(r['expected'])} | {_cell(r['observed'])} |" for r in rows
    ]
    return "\n".join(lines)


def main() -> int:
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as fh:
        log = Path(fh.name)
    env = {**os.environ, "CPTRACE_FAULT_LOG": str(log)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", *TESTS], cwd=ROOT, env=env)
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    log.unlink()
    if result.returncode != 0:
        print("some fault tests failed; docs/service.md left as it was", file=sys.stderr)
        return result.returncode
    text = DOC.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{START}\n{render(rows)}\n{END}{tail}")
    print(f"wrote {len(rows)} rows to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
