"""A profiled rank does not import torch's compiler stack (``runners/profile/lean_start.py``).

``torch.profiler`` looks up ``torch._inductor`` whenever a profiling cycle begins, which imports
inductor and dynamo (~1.6 s of CPU per rank). The step profiler of ``cptrace profile`` is driven
through wait, warm-up, active steps and its export in a fresh interpreter (this process may have
imported inductor already), which reports what it imported; the profiler still reads inductor's
flag once inductor is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROFILED = """
import json, sys
from pathlib import Path
import torch
from runners.profile.torchprof import StepProfiler, TorchProfileConfig

out = Path(sys.argv[1])
profiler = StepProfiler(
    TorchProfileConfig(out_dir=out, wait=1, warmup=1, active=2, with_stack=False), rank=0
)
x = torch.ones(8, 8)
for _ in range(profiler.total_steps + 1):
    profiler.step()
    x = x @ x / 8
profiler.finish()
imported = "torch._inductor" in sys.modules
import torch._inductor.config as inductor_config
from runners.profile.lean_start import without_inductor_import
inductor_config.triton.cudagraphs = True
late = torch.profiler.profile()
with without_inductor_import():
    late.prepare_trace()
print(json.dumps({
    "inductor_imported": imported,
    "exported": profiler.exported is not None and profiler.exported.exists(),
    "still_lazy": "_inductor" in torch._lazy_modules,
    "late_cudagraphs": late.has_cudagraphs,
}))
"""


@pytest.mark.slow
def test_profiled_steps_do_not_import_inductor(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROFILED, str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {
        "inductor_imported": False,  # the profiler's lookup imported nothing
        "exported": True,  # and it still recorded and exported its active steps
        "still_lazy": True,  # torch's lazy name is back after each call
        "late_cudagraphs": True,  # once inductor is imported, its flag is read as before
    }
