"""Read time and peak memory of one Kineto trace written in different JSON layouts.

The same events, re-serialized the ways other tools write them: Kineto's own line layout (the
fast path), ``json.dump(obj, indent=1)``, ``indent=2``, compact separators, and compact with
sorted keys. Each read (``read_kineto``) runs in a fresh subprocess that reports its wall time,
its CPU time and its peak RSS (``ru_maxrss``, interpreter and imports included; "read MB" is
the peak minus the peak before the read, i.e. what the read itself added); the table
shows the median of ``--repeat`` runs and the CPU-time ratio to Kineto's layout (CPU time,
because the shared development machine's wall time mostly measures the other users). The issue
asks for at most 1.5x on every layout.

    .venv/bin/python benchmarks/kineto_layouts.py                 # the TE reference rank 0
    .venv/bin/python benchmarks/kineto_layouts.py --trace x.json.gz --repeat 5

Prints a table; it asserts nothing (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / "tests/data/te-2.20.2-h200x2/kineto_3arms_rank0.json.gz"

_CHILD = """
import json, resource, sys, time
from analyzers.readers.kineto import read_kineto
def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
wall, used = time.perf_counter(), cpu()
trace = read_kineto(sys.argv[1], rank=0)
wall, used = time.perf_counter() - wall, cpu() - used
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall": wall, "cpu": used, "peak": peak, "base": before,
                  "parser": trace.metadata["json_parser"],
                  "rows": len(trace.activities) + len(trace.launches) + len(trace.ranges)}))
"""


def _layouts(trace: Path, out: Path) -> dict[str, Path]:
    raw = gzip.decompress(trace.read_bytes()) if trace.name.endswith(".gz") else trace.read_bytes()
    doc = json.loads(raw)
    files = {"kineto (own)": out / "own.json"}
    files["kineto (own)"].write_bytes(raw)
    variants = {
        "indent=1": {"indent": 1},
        "indent=2": {"indent": 2},
        "compact": {"separators": (",", ":")},
        "compact, sorted keys": {"separators": (",", ":"), "sort_keys": True},
    }
    for name, options in variants.items():
        path = out / f"{name.replace(' ', '_').replace(',', '')}.json"
        path.write_text(json.dumps(doc, **options))  # type: ignore[arg-type]
        files[name] = path
    return files


def _measure(path: Path) -> dict[str, float | str | int]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    result: dict[str, float | str | int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cptrace-layouts-") as tmp:
        files = _layouts(args.trace, Path(tmp))
        runs: dict[str, list[dict[str, float | str | int]]] = {name: [] for name in files}
        for _ in range(args.repeat):  # interleaved, so load changes hit every layout alike
            for name, path in files.items():
                runs[name].append(_measure(path))
        sizes = {name: path.stat().st_size for name, path in files.items()}
    base = statistics.median(float(r["cpu"]) for r in runs["kineto (own)"])
    print(f"trace: {args.trace} ({args.repeat} runs each, medians)")
    head = (
        f"{'layout':<22} {'MB':>6} {'parser':<14} {'rows':>7} {'wall s':>7} {'CPU s':>7} "
        f"{'peak RSS MB':>11} {'read MB':>7} {'CPU ratio':>9}"
    )
    print(head)
    print("-" * len(head))
    for name, items in runs.items():
        cpu = statistics.median(float(r["cpu"]) for r in items)
        wall = statistics.median(float(r["wall"]) for r in items)
        peak = statistics.median(float(r["peak"]) for r in items)
        grown = statistics.median(float(r["peak"]) - float(r["base"]) for r in items)
        print(
            f"{name:<22} {sizes[name] / 1e6:>6.1f} {items[0]['parser']!s:<14} "
            f"{items[0]['rows']!s:>7} {wall:>7.3f} {cpu:>7.3f} {peak / 1e6:>11.1f} "
            f"{grown / 1e6:>7.1f} "
            f"{cpu / base:>8.2f}x"
        )


if __name__ == "__main__":
    main()
