"""End-to-end ``cptrace analyze`` vs Holistic Trace Analysis on the same Kineto traces.

Each measurement runs in a fresh subprocess (no warm caches, no shared allocator) that reports
its own wall time and CPU time for the work, and its peak RSS (``ru_maxrss``: the main process
only, interpreter, imports and data). Both tools may fork worker processes (HTA parses ranks with
a multiprocessing pool), which ``ru_maxrss`` of the main process does not see, so the benchmark
also samples the proportional set size (PSS: shared pages split between the processes that
share them) of the whole process tree every 10 ms and reports its peak ("tree PSS"). CPU time
counts the workers too. HTA does "parse plus its kernel breakdown" (``TraceAnalysis`` over the
trace directory, then ``get_gpu_kernel_breakdown``); cptrace does its whole ``analyze`` (read,
attribute, windows, metrics, findings).

"cptrace analyze (CLI)" is the command itself, the whole process (interpreter, imports,
analysis, the text report written to /dev/null): ``analyze_stages.py``'s CLI child; its
"work s" is the process's wall time from start to exit, and it is compared with HTA's whole
process too (imports included), the issue 28 target (<= 0.8 s, >= 10x HTA).

"cptrace, 2 read processes" is the same ``analyze`` with ``CPTRACE_READ_WORKERS=2``: the
per-rank files parsed in two forked workers (opt-in; the default reads them one by one).

``--scale N`` adds a second table on the same traces with their events written N times (each
copy shifted in time past the previous one, correlation ids renumbered), in Kineto's own text
layout, into a temporary directory: the real pair is small enough that the interpreter and
import baseline dominate peak memory, the scaled pair shows the data-dependent part.

``--base TREE`` runs the CLI row on a second source tree too (a worktree of the base commit),
interleaved with the others, and prints the two CLI rows side by side (an A/B of a change).

HTA lives in its own virtual environment so the project's stays untouched (not a project
dependency); its python comes from ``--hta-python`` or ``$CPTRACE_HTA_PYTHON``::

    python3 -m venv $TMPDIR/hta-venv && $TMPDIR/hta-venv/bin/pip install HolisticTraceAnalysis
    export CPTRACE_HTA_PYTHON=$TMPDIR/hta-venv/bin/python
    .venv/bin/python benchmarks/hta_compare.py --scale 10

Prints a table; it asserts nothing (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from analyze_stages import CLI_CHILD, byte_compile, cli_args  # noqa: E402  (one CLI child)

DEFAULT_TRACES = [
    ROOT / "tests/data/te-2.20.2-h200x2/kineto_3arms_rank0.json.gz",
    ROOT / "tests/data/te-2.20.2-h200x2/kineto_3arms_rank1.json.gz",
]

_CPU = """
def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
"""

_CPTRACE_CHILD = (
    """
import json, resource, sys, time
"""
    + _CPU
    + """
t0 = time.perf_counter()
from analyzers.pipeline import run_analysis
t1, c1 = time.perf_counter(), cpu()
marks = {}
def progress(stage, fraction):
    marks.setdefault(stage, time.perf_counter())
analysis = run_analysis(sys.argv[1:], step_pattern=r"^arm:", progress=progress)
t2 = time.perf_counter()
kernels = sum(h.kernels for h in analysis.report.helpers if h.window == "whole trace")
print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "cpu_s": cpu() - c1, "kernels": kernels,
                  "read_s": marks["attributing"] - t1, "analysis_s": t2 - marks["attributing"],
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
)

_HTA_CHILD = (
    """
import json, logging, resource, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
"""
    + _CPU
    + """
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1, c1 = time.perf_counter(), cpu()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
kernel_type, kernels = analysis.get_gpu_kernel_breakdown(visualize=False)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "cpu_s": cpu() - c1,
                  "kernels": int(len(kernels)),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
)
_SAMPLE_S = 0.01
OURS = "cptrace analyze"
OURS_TWO = "cptrace, 2 read processes"
OURS_CLI = "cptrace analyze (CLI)"
OURS_CLI_BASE = "cptrace analyze (CLI), base"
THEIRS = "HTA parse + kernel breakdown"


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (via /proc/<pid>/task/<tid>/children)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except OSError:
                continue
    return out


def _pss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:  # the process ended between listing and reading
        return 0
    found = re.search(r"^Pss:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) if found else 0


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, float]:
    """Run one measurement; adds ``tree_pss_mb``, the sampled peak PSS of its process tree."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        full_env = {**os.environ, **(env or {})}
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, text=True, env=full_env)
        peak = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, sum(_pss_kib(p) for p in _tree(proc.pid)))
                time.sleep(_SAMPLE_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # wait4: the child's own CPU time for the whole process (imports included)
        _, status, usage = os.wait4(proc.pid, 0)
        process_s = time.perf_counter() - start
        code = proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        if code != 0:
            raise SystemExit(f"{cmd[0]} failed ({code}):\n{err.read()[-2000:]}")
        row: dict[str, float] = json.loads(out.read().strip().splitlines()[-1])
    row["tree_pss_mb"] = peak / 1024
    row["process_s"] = process_s
    row["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    return row


def _cli_row(row: dict[str, Any]) -> dict[str, float]:
    """The CLI child's JSON as a row of the table: the whole process is its work."""
    return {
        "work_s": row["process_s"],
        "process_s": row["process_s"],
        "process_cpu_s": row["process_cpu_s"],
        "cpu_s": row["process_cpu_s"],
        # the CLI's own cost: the whole process less the library call (analyzers.analyze)
        "outside_s": row["process_s"] - row["wall"]["analyze"],
        "outside_cpu_s": row["process_cpu_s"] - row["cpu"]["analyze"],
        "import_s": 0.0,
        "kernels": 0,
        "rss_mb": row["rss_mb"],
        "tree_pss_mb": row["tree_pss_mb"],
    }


_TS = re.compile(rb'"ts": (\d+)\.(\d{3})\b')
_CORRELATION = re.compile(rb'("correlation": |"id": )(\d+)')


def _scaled_copy(source: Path, target: Path, copies: int) -> None:
    """Write ``source``'s events ``copies`` times, each copy later in time, in Kineto's layout.

    Timestamps move by the trace span (plus 1 ms) per copy and correlation/flow ids by the
    largest id, so the copies are consecutive, distinct iterations of the same workload.
    """
    with gzip.open(source, "rb") as fh:
        text = fh.read()
    open_at = text.index(b'"traceEvents": [\n') + len(b'"traceEvents": [\n')
    close_at = text.rindex(b"\n  }\n  ]") + 4
    head, events, tail = text[:open_at], text[open_at:close_at], text[close_at:]
    stamps = [int(a) * 1000 + int(b) for a, b in _TS.findall(events)]
    shift = max(stamps) - min(stamps) + 1_000_000
    top_id = max(int(m[1]) for m in _CORRELATION.findall(events)) + 1
    with gzip.open(target, "wb", compresslevel=1) as out:
        out.write(head)
        for k in range(copies):
            if k:
                out.write(b",\n")
            if not k:
                out.write(events)
                continue

            def move(m: re.Match[bytes], k: int = k) -> bytes:
                ns = int(m[1]) * 1000 + int(m[2]) + k * shift
                return b'"ts": %d.%03d' % divmod(ns, 1000)

            def renumber(m: re.Match[bytes], k: int = k) -> bytes:
                return m[1] + b"%d" % (int(m[2]) + k * top_id)

            out.write(_CORRELATION.sub(renumber, _TS.sub(move, events)))
        out.write(tail)


def _measure(
    traces: list[Path], hta_python: str, repeat: int, base: Path | None = None
) -> dict[str, list[dict[str, float]]]:
    with tempfile.TemporaryDirectory(prefix="hta-traces-") as tmp:
        # HTA reads every trace of a directory; give it exactly these files.
        for path in traces:
            shutil.copy(path, Path(tmp) / path.name)
        cptrace_cmd = [sys.executable, "-c", _CPTRACE_CHILD, *map(str, traces)]
        cli_cmd = [sys.executable, "-c", CLI_CHILD, *cli_args(traces, "^arm:", [])]
        byte_compile(ROOT)
        if base is not None:
            byte_compile(base)
        hta_cmd = [hta_python, "-c", _HTA_CHILD, tmp]
        results: dict[str, list[dict[str, float]]] = {
            OURS: [],
            OURS_TWO: [],
            OURS_CLI: [],
            THEIRS: [],
        }
        if base is not None:
            results[OURS_CLI_BASE] = []
        for _ in range(repeat):  # interleaved, so drift in machine load hits all
            results[OURS].append(_run(cptrace_cmd, ROOT))
            results[OURS_TWO].append(_run(cptrace_cmd, ROOT, {"CPTRACE_READ_WORKERS": "2"}))
            results[OURS_CLI].append(_cli_row(_run(cli_cmd, ROOT, {"PYTHONPATH": str(ROOT)})))
            results[THEIRS].append(_run(hta_cmd, ROOT))
            if base is not None:  # the same CLI child on the base tree's code
                row = _run(cli_cmd, base, {"PYTHONPATH": str(base)})
                results[OURS_CLI_BASE].append(_cli_row(row))
    return results


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


HTA_PYTHON_ENV = "CPTRACE_HTA_PYTHON"


def _check_hta_python(python: str | None) -> None:
    """Stop with one clear line unless ``python`` runs and imports HTA."""
    if not python:
        raise SystemExit(
            f"hta_compare: no HTA python: give --hta-python or set ${HTA_PYTHON_ENV} to the python "
            "of a venv with HolisticTraceAnalysis (python3 -m venv $TMPDIR/hta-venv && "
            "$TMPDIR/hta-venv/bin/pip install HolisticTraceAnalysis)"
        )
    try:
        done = subprocess.run(
            [python, "-c", "import hta.trace_analysis"], capture_output=True, text=True
        )
    except OSError as exc:
        raise SystemExit(f"hta_compare: cannot run the HTA python {python}: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(
            f"hta_compare: {python} cannot import HolisticTraceAnalysis ({last}); install it "
            "there with pip install HolisticTraceAnalysis"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hta-python",
        default=os.environ.get(HTA_PYTHON_ENV),
        help=f"python of a venv with HolisticTraceAnalysis installed (default: ${HTA_PYTHON_ENV})",
    )
    parser.add_argument(
        "--traces",
        nargs="+",
        type=Path,
        default=DEFAULT_TRACES,
        help="Kineto traces, one per rank (default: the TE 2.20.2 3-arm pair)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per tool")
    parser.add_argument(
        "--scale",
        type=int,
        default=0,
        help="also run on the traces with their events written this many times (0: skip)",
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="also run the CLI row on this source tree (a worktree of the base commit), "
        "interleaved, and print the CLI's A/B table",
    )
    args = parser.parse_args()
    _check_hta_python(args.hta_python)

    print(f"load average before the runs: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    _table(
        args.traces, _measure(args.traces, args.hta_python, args.repeat, args.base), args.repeat, ""
    )
    if args.scale > 1:
        with tempfile.TemporaryDirectory(prefix="cptrace-scaled-") as tmp:
            scaled = [Path(tmp) / p.name for p in args.traces]
            for source, target in zip(args.traces, scaled, strict=True):
                _scaled_copy(source, target, args.scale)
            print()
            results = _measure(scaled, args.hta_python, args.repeat, args.base)
            _table(scaled, results, args.repeat, f" (events x{args.scale})")


def _table(
    traces: list[Path], results: dict[str, list[dict[str, float]]], repeat: int, label: str
) -> None:
    size_mb = sum(p.stat().st_size for p in traces) / 2**20
    print(
        f"inputs{label}: {len(traces)} Kineto files, {size_mb:.1f} MiB gzipped; "
        f"median of {repeat} fresh processes each"
    )
    print(
        f"{'tool':30} {'work s':>7} {'cpu s':>6} {'import s':>9} {'process s':>10} "
        f"{'process cpu s':>14} {'peak RSS MiB':>13} {'tree PSS MiB':>13} {'n out':>6}"
    )
    for tool, rows in results.items():
        print(
            f"{tool:30} {_median(rows, 'work_s'):7.2f} {_median(rows, 'cpu_s'):6.2f} "
            f"{_median(rows, 'import_s'):9.2f} {_median(rows, 'process_s'):10.2f} "
            f"{_median(rows, 'process_cpu_s'):14.2f} {_median(rows, 'rss_mb'):13.0f} "
            f"{_median(rows, 'tree_pss_mb'):13.0f} {int(_median(rows, 'kernels')):6d}"
        )
    print(
        "  n out: cptrace's kernels attributed over the whole trace, HTA's kernel-breakdown "
        "rows (a check that both did the work, not a comparison)"
    )
    theirs = results[THEIRS]
    for name in (OURS, OURS_TWO):
        ours = results[name]
        print(
            f"  {name} split: read {_median(ours, 'read_s'):.2f} s, attribution + windows + "
            f"metrics + findings {_median(ours, 'analysis_s'):.2f} s"
        )
    for name in (OURS, OURS_TWO):
        ours = results[name]
        speed = _median(theirs, "work_s") / _median(ours, "work_s")
        cpu = _median(theirs, "cpu_s") / _median(ours, "cpu_s")
        total = (_median(theirs, "work_s") + _median(theirs, "import_s")) / (
            _median(ours, "work_s") + _median(ours, "import_s")
        )
        memory = _median(ours, "rss_mb") / _median(theirs, "rss_mb")
        tree = _median(ours, "tree_pss_mb") / _median(theirs, "tree_pss_mb")
        print(
            f"{name}: {speed:.1f}x faster on the work ({cpu:.1f}x in CPU time, {total:.1f}x "
            f"including imports), {memory:.2f}x of HTA's peak RSS, {tree:.2f}x of its tree PSS "
            "(targets: >= 10x, <= 0.33x)"
        )
    cli = results[OURS_CLI]
    whole, whole_cpu = _median(theirs, "process_s"), _median(theirs, "process_cpu_s")
    print(
        f"{OURS_CLI}: {_median(cli, 'process_s'):.2f} s wall for the whole process "
        f"({_median(cli, 'process_cpu_s'):.2f} s CPU); HTA's whole process {whole:.2f} s "
        f"({whole_cpu:.2f} s CPU): {whole / _median(cli, 'process_s'):.1f}x "
        f"({whole_cpu / _median(cli, 'process_cpu_s'):.1f}x in CPU time), HTA's work alone "
        f"{_median(theirs, 'work_s') / _median(cli, 'process_s'):.1f}x; "
        f"{_median(cli, 'rss_mb') / _median(theirs, 'rss_mb'):.2f}x of HTA's peak RSS, "
        f"{_median(cli, 'tree_pss_mb') / _median(theirs, 'tree_pss_mb'):.2f}x of its tree PSS "
        "(targets: <= 0.8 s, >= 10x, <= 0.33x)"
    )
    print(
        f"  outside analyzers.analyze (the CLI's own cost: interpreter, imports, render, exit): "
        f"{_median(cli, 'outside_s'):.2f} s wall, {_median(cli, 'outside_cpu_s'):.2f} s CPU "
        "(target <= 0.15 s)"
    )
    print()
    print("| whole process | wall s | CPU s | peak RSS MiB | tree PSS MiB |")
    print("|---|---|---|---|---|")
    for name, rows in ((OURS_CLI, cli), ("HTA (imports, parse, kernel breakdown)", theirs)):
        print(
            f"| {name} | {_median(rows, 'process_s'):.2f} | {_median(rows, 'process_cpu_s'):.2f} "
            f"| {_median(rows, 'rss_mb'):.0f} | {_median(rows, 'tree_pss_mb'):.0f} |"
        )
    print(
        f"| HTA / CLI | {whole / _median(cli, 'process_s'):.1f}x "
        f"| {whole_cpu / _median(cli, 'process_cpu_s'):.1f}x "
        f"| CLI / HTA {_median(cli, 'rss_mb') / _median(theirs, 'rss_mb'):.2f}x "
        f"| CLI / HTA {_median(cli, 'tree_pss_mb') / _median(theirs, 'tree_pss_mb'):.2f}x |"
    )
    if OURS_CLI_BASE in results:
        _print_cli_ab(results[OURS_CLI_BASE], cli, theirs)
    print(f"load average after the runs: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")


def _print_cli_ab(
    base: list[dict[str, float]], cli: list[dict[str, float]], theirs: list[dict[str, float]]
) -> None:
    """The CLI row of the base tree and of this one side by side (medians), HTA's whole
    process as the yardstick of the ratios."""
    print()
    print("| cptrace analyze (CLI), median | base | this tree | delta |")
    print("|---|---|---|---|")
    for label, key in (
        ("process wall s", "process_s"),
        ("process CPU s", "process_cpu_s"),
        ("outside analyze wall s", "outside_s"),
        ("outside analyze CPU s", "outside_cpu_s"),
        ("peak RSS MiB", "rss_mb"),
        ("tree PSS MiB", "tree_pss_mb"),
    ):
        b, c = _median(base, key), _median(cli, key)
        delta = f"{(c - b) / b:+.1%}" if b else "n/a"
        print(f"| {label} | {b:.3f} | {c:.3f} | {delta} |")
    whole = _median(theirs, "process_s")
    print(
        f"| HTA whole process / CLI wall | {whole / _median(base, 'process_s'):.1f}x "
        f"| {whole / _median(cli, 'process_s'):.1f}x | |"
    )


if __name__ == "__main__":
    main()
