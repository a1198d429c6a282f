"""End-to-end ``cptrace analyze`` vs Holistic Trace Analysis on the same Kineto traces.

Each measurement runs in a fresh subprocess (no warm caches, no shared allocator) that reports
its own wall time for the work and its peak RSS (``ru_maxrss``, the whole process: interpreter,
imports and data). HTA does "parse plus its kernel breakdown" (``TraceAnalysis`` over the trace
directory, then ``get_gpu_kernel_breakdown``); cptrace does its whole ``analyze`` (read,
attribute, windows, metrics, findings).

HTA lives in its own virtual environment so the project's stays untouched::

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis
    .venv/bin/python benchmarks/hta_compare.py --hta-python /tmp/hta-venv/bin/python

Prints a table; it asserts nothing (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = [
    ROOT / "tests/data/te-2.20.2-h200x2/kineto_3arms_rank0.json.gz",
    ROOT / "tests/data/te-2.20.2-h200x2/kineto_3arms_rank1.json.gz",
]

_CPTRACE_CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from analyzers.pipeline import run_analysis
t1 = time.perf_counter()
marks = {}
def progress(stage, fraction):
    marks.setdefault(stage, time.perf_counter())
analysis = run_analysis(sys.argv[1:], step_pattern=r"^arm:", progress=progress)
t2 = time.perf_counter()
kernels = sum(h.kernels for h in analysis.report.helpers if h.window == "whole trace")
print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "kernels": kernels,
                  "read_s": marks["attributing"] - t1, "analysis_s": t2 - marks["attributing"],
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_HTA_CHILD = """
import json, logging, resource, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
kernel_type, kernels = analysis.get_gpu_kernel_breakdown(visualize=False)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "kernels": int(len(kernels)),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run(cmd: list[str], cwd: Path) -> dict[str, float]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hta-python",
        default="/tmp/hta-venv/bin/python",
        help="python of a venv with HolisticTraceAnalysis installed",
    )
    parser.add_argument(
        "--traces",
        nargs="+",
        type=Path,
        default=DEFAULT_TRACES,
        help="Kineto traces, one per rank (default: the TE 2.20.2 3-arm pair)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per tool")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hta-traces-") as tmp:
        # HTA reads every trace of a directory; give it exactly these files.
        for path in args.traces:
            shutil.copy(path, Path(tmp) / path.name)
        cptrace_cmd = [sys.executable, "-c", _CPTRACE_CHILD, *map(str, args.traces)]
        hta_cmd = [args.hta_python, "-c", _HTA_CHILD, tmp]
        results = {"cptrace analyze": [], "HTA parse + kernel breakdown": []}
        for _ in range(args.repeat):  # interleaved, so drift in machine load hits both
            results["cptrace analyze"].append(_run(cptrace_cmd, ROOT))
            results["HTA parse + kernel breakdown"].append(_run(hta_cmd, ROOT))

    size_mb = sum(p.stat().st_size for p in args.traces) / 2**20
    print(
        f"inputs: {len(args.traces)} Kineto files, {size_mb:.1f} MiB gzipped; "
        f"median of {args.repeat} fresh processes each"
    )
    print(f"{'tool':32} {'work s':>8} {'import s':>9} {'peak RSS MiB':>13}")
    for tool, rows in results.items():
        print(
            f"{tool:32} {_median(rows, 'work_s'):8.2f} {_median(rows, 'import_s'):9.2f} "
            f"{_median(rows, 'rss_mb'):13.0f}"
        )
    ours, theirs = results["cptrace analyze"], results["HTA parse + kernel breakdown"]
    print(
        f"  cptrace split: read {_median(ours, 'read_s'):.2f} s, attribution + windows + "
        f"metrics + findings {_median(ours, 'analysis_s'):.2f} s"
    )
    speed = _median(theirs, "work_s") / _median(ours, "work_s")
    total = (_median(theirs, "work_s") + _median(theirs, "import_s")) / (
        _median(ours, "work_s") + _median(ours, "import_s")
    )
    memory = _median(ours, "rss_mb") / _median(theirs, "rss_mb")
    print(
        f"cptrace is {speed:.1f}x faster on the work ({total:.1f}x including imports) and uses "
        f"{memory:.2f}x of HTA's peak RSS (targets: >= 10x, <= 0.33x)"
    )


if __name__ == "__main__":
    main()
