"""The stage benchmark runs end to end on the real 3-arm nsys export, paired with a second tree
(here the same one): every stage row is printed for both trees and the account's share line is
there. A smoke run of the script, not a measurement: no time is asserted."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_paired_run_prints_every_stage_for_both_trees() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "analyze_stages.py"), "--base", str(ROOT),
         "--input", "nsys", "--repeat", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("nsys 3 arms: 19,010 activities") for line in lines)
    for stage in ("read", "attribute", "metrics", "account", "findings", "report", "total"):
        row = next(line for line in lines if line.startswith(f"| {stage} |"))
        assert len(row.strip("|").split("|")) == 7  # stage, 2 x (cpu, wall), 2 deltas
    assert any(line.startswith("account adds (current):") for line in lines)
