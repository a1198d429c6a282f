"""What many distinct long kernel names cost: upload size, analysis time, report size.

Issue 24, item 6: a 134 KB upload holding 5,000 distinct 4 KB kernel names produced a 92 MB
report. This builds such a Kineto trace from the synthetic rank-0 trace in ``tests/data`` (its
kernels cloned with distinct names, two instances of each), analyses it once per name count
and prints, per count: the gzipped trace's size, the analysis wall and CPU seconds, the
report's JSON size and the part of it in kernel tables and in the timeline, and the kernel
rows. A trace of the real TE workload gives a 2-2.6 MB report, for scale.

Usage::

    python benchmarks/hostile_names.py                       # 300, 1000 and 5000 names
    python benchmarks/hostile_names.py --names 5000 --chars 4096
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path

from analyzers import analyze

TRACE = Path(__file__).resolve().parents[1] / "tests/data/synthetic-h200x2/kineto_rank0.json.gz"


def build(names: int, chars: int) -> bytes:
    """The synthetic trace with its kernels replaced by ``names`` distinct names, twice each."""
    trace = json.loads(gzip.decompress(TRACE.read_bytes()))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    events = [e for e in trace["traceEvents"] if e.get("cat") != "kernel"]
    for i in range(names * 2):
        k = dict(kernels[i % len(kernels)])
        k["name"] = f"{i % names:05d}" + "k" * (chars - 5)
        k["args"] = {**k.get("args", {}), "correlation": 10**7 + i}
        k["dur"] = 1 + (i % names) % 97 + i // names
        events.append(k)
    trace["traceEvents"] = events
    return gzip.compress(json.dumps(trace).encode())


def measure(names: int, chars: int, folder: Path) -> list[str]:
    path = folder / f"names-{names}.json.gz"
    path.write_bytes(build(names, chars))
    wall, cpu = time.perf_counter(), time.process_time()
    report = analyze([path])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    dumped = report.model_dump(mode="json")
    mb = 1e6
    return [
        f"{names:,}",
        f"{path.stat().st_size / 1024:.0f} KB",
        f"{wall:.1f} / {cpu:.1f}",
        f"{len(json.dumps(dumped)) / mb:.2f}",
        f"{len(json.dumps(dumped['kernels'])) / mb:.2f}",
        f"{len(json.dumps(dumped['timeline'])) / mb:.2f}",
        str(len(report.kernels)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, action="append", help="distinct names (repeat)")
    parser.add_argument("--chars", type=int, default=4096, help="characters per name")
    args = parser.parse_args()
    header = [
        "names", "upload", "analysis wall / CPU s", "report MB", "kernel tables MB",
        "timeline MB", "kernel rows",
    ]  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for names in args.names or [300, 1000, 5000]:
            rows.append(measure(names, args.chars, Path(tmp)))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
