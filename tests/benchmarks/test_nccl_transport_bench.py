"""The transport benchmark runs end to end with two real gloo processes (its --cpu smoke mode):
the table has a positive bandwidth for every size and method, and the JSON matches the table."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_smoke_run_prints_every_row(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "nccl_transport.py"), "--cpu",
         "--sizes-mb", "0.25,1", "--iters", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["mb"], r["method"]) for r in rows} == {
        (mb, m) for mb in (0.25, 1.0) for m in ("send/recv", "batched isend/irecv")}
    assert all(r["gb_s"] > 0 and r["median_ms"] > 0 for r in rows)
    for r in rows:
        assert f"| {r['mb']} | {r['method']} | {r['median_ms']:.3f} |" in done.stdout
