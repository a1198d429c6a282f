"""The gate's power benchmark runs on the demo bundles' real iteration times and prints one row
per shift, every cell's three fractions summing to one; identical code never fails."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gate_power_prints_the_table() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gate_power.py"), "--trials", "22"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {
        line.split(" | ")[0]: line for line in done.stdout.splitlines() if line.startswith("| ")
    }
    assert set(rows) >= {"| identical", "| +5%", "| +10%", "| +50%", "| 4x"}
    for line in rows.values():
        for cell in line.strip("| ").split(" | ")[1:]:
            if "/" in cell:
                parts = [float(p.strip().rstrip("%")) for p in cell.split("/")]
                assert abs(sum(parts) - 100.0) < 0.2, line
    assert all(cell.startswith("0.0% /") for cell in rows["| identical"].split(" | ")[1:])
