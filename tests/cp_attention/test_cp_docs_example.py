"""The runnable example in docs/cp_attention.md runs and prints what the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_example_runs(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "cp_attention.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    example = next(b for b in blocks if "__main__" in b)
    script = tmp_path / "example.py"
    script.write_text(example)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "output (48, 4, 16) padding rows zero: True" in done.stdout
