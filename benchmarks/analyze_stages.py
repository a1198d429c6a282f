"""``analyze`` per stage, and paired against another source tree (a base commit).

Why paired: on a shared machine the load moves timings by 2x between minutes; a base and the
current tree run alternately (ABAB, a fresh process each) see the same load, so their ratio is
meaningful where two separate runs are not. Each child process times the stages of one
``run_analysis`` (imports excluded, everything else included) by wrapping the functions
``analyzers.pipeline`` calls, so the same child works on any tree whose pipeline calls them:

========== ================================================================================
read       ``_read`` (the readers, merging)
attribute  ``match_ranges``, ``attribute``, ``find_windows``
metrics    ``compute_metrics`` (helper/stream/kernel tables, figures, GPU timeline), iterations
account    ``compute_accounts`` and ``timeline_gaps`` (its idle pieces drawn on the run page's
           timeline); issue 11, absent in older trees
findings   ``evaluate``, ``idle_statement``, ``host_time``, ``host_time_findings``,
           ``uncited_observations`` (whichever the tree has)
report     building the ``AnalysisReport`` (pydantic validation)
other      the rest of ``run_analysis`` (catalog, notes, environment)
========== ================================================================================

Every stage is reported as CPU seconds of the process (user + system: the stable number on a
loaded machine) and wall seconds; ``total`` is the whole ``run_analysis``, ``w/o account`` is
total minus the account stage (what ``analyze`` costs without it), ``account adds`` = account
/ (total - account) (issue 11's target: at most 20%). Peak RSS is the child's ``VmHWM``.

Inputs (``--input``, repeatable): ``pair`` (the real TE 2.20.2 Kineto pair, the HTA comparison
traces), ``x10`` (the pair with its events written 10 times, as ``hta_compare.py --scale 10``
builds it), ``nsys`` (the real 3-arm nsys export), ``nsys2m`` (``--large``, default
``cptrace_large_nsys.sqlite`` in the temp folder, built by
``make_large_nsys.py --kernels 2000000``).

Guard mode (``--guard COMMIT``): the base tree is a temporary detached worktree of ``COMMIT``
(removed afterwards), paired with the current tree as above; after the tables, every stage and
the total is checked, and the script exits 1 when one's median CPU time grows by more than
``--threshold`` (default 10%) against the base. A growth below ``--floor`` seconds (default
0.005) is not counted: a stage of a few milliseconds moves by more than 10% between two fresh
processes on a shared machine. The closing note of a change to ``analyzers/`` carries this table.

CLI mode (``--cli``): a second table per input, of the whole ``cptrace analyze`` process
(``cptrace analyze TRACES --step-pattern P`` in a fresh interpreter, its report written to
/dev/null, as in a CI log, and ending as the console script ends, ``cptrace.cli.exit_now``,
where the tree has it): ``process`` is the child's wall time and CPU time as the parent sees
them (interpreter start to exit, its teardown included); ``analyze`` is the library call the
command makes (``analyzers.analyze``: read to report); ``outside analyze`` = process -
analyze, the CLI's own cost (issue 28: <= 0.15 s), split into ``start, CLI import, exit``
(interpreter, Typer, the command modules, the interpreter's exit), ``pipeline import``
(``analyzers.pipeline``: numpy, the report models) and ``render + rest`` (the tables).
``--report SECTION`` (repeatable) is passed on.

Each tree is byte-compiled before the first run (``byte_compile``): an installed cptrace has its
bytecode, and a tree without it compiles the modules it imports lazily (the readers) inside the
timed stages.
``hta_compare.py`` runs the same child for its CLI row.

Usage::

    git worktree add ../cptrace-base ee57ffc
    .venv/bin/python benchmarks/analyze_stages.py --base ../cptrace-base --input pair --repeat 3
    .venv/bin/python benchmarks/analyze_stages.py --guard main --input pair --repeat 5
    .venv/bin/python benchmarks/analyze_stages.py --guard main --input pair --cli --repeat 5

Prints a table per input (medians); only the guard mode has an exit status of its own (1: a
stage grew), it asserts nothing else (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TE = ROOT / "tests/data/te-2.20.2-h200x2"
PAIR = [TE / "kineto_3arms_rank0.json.gz", TE / "kineto_3arms_rank1.json.gz"]
NSYS = TE / "nsys_3arms.sqlite.gz"
LARGE = Path(tempfile.gettempdir()) / "cptrace_large_nsys.sqlite"
STAGES: dict[str, tuple[str, ...]] = {
    "read": ("_read",),
    "attribute": ("match_ranges", "attribute", "find_windows"),
    "metrics": ("compute_metrics", "_iterations"),
    "account": ("compute_accounts", "timeline_gaps"),
    "findings": (
        "evaluate",
        "idle_statement",
        "host_time",
        "host_time_findings",
        "uncited_observations",
    ),
    "report": ("AnalysisReport",),
}
ROWS = [*STAGES, "other", "total", "w/o account"]


def child(paths: list[str], step_pattern: str) -> dict[str, Any]:
    """One ``run_analysis`` in this process, timed per stage (see the module docstring)."""
    import resource

    from analyzers import pipeline

    wall: dict[str, float] = dict.fromkeys(STAGES, 0.0)
    cpu: dict[str, float] = dict.fromkeys(STAGES, 0.0)

    def timed(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall[stage] += time.perf_counter() - w
                cpu[stage] += time.process_time() - c

        return wrapper

    for stage, names in STAGES.items():
        for name in names:
            if hasattr(pipeline, name):
                setattr(pipeline, name, timed(stage, getattr(pipeline, name)))
    w0, c0 = time.perf_counter(), time.process_time()
    analysis = pipeline.run_analysis(paths, step_pattern=step_pattern)
    wall["total"], cpu["total"] = time.perf_counter() - w0, time.process_time() - c0
    for table in (wall, cpu):
        table["other"] = table["total"] - sum(table[s] for s in STAGES)
        table["w/o account"] = table["total"] - table["account"]
    return {
        "wall": wall,
        "cpu": cpu,
        "rss_mb": _peak_rss_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "activities": len(analysis.trace.activities),
        "windows": len(analysis.report.windows),
    }


CLI_ROWS = ["process", "analyze", "outside analyze", "start, CLI import, exit", "pipeline import",
            "render + rest"]  # fmt: skip
"""Rows of the CLI table (see the module docstring)."""


CLI_CHILD = """
import time
import json, os, resource, sys
import analyzers
wall, cpu = {}, {}
def timed_analyze(*args, **kwargs):
    w, c = time.perf_counter(), time.process_time()
    try:
        return pipeline.analyze(*args, **kwargs)
    finally:
        wall["analyze"], cpu["analyze"] = time.perf_counter() - w, time.process_time() - c
analyzers.analyze = timed_analyze  # found before the package's lazy __getattr__
import cptrace.cli
# the console script's app: the analyze command's module alone, where the tree builds it so
app = cptrace.cli.app_for(["analyze"]) if hasattr(cptrace.cli, "app_for") else cptrace.cli.app
w1, c1 = time.perf_counter(), time.process_time()
import importlib.util
if importlib.util.find_spec("cptrace.commands._numpy"):  # numpy as the command imports it
    from cptrace.commands._numpy import import_numpy
    import_numpy()
from analyzers import pipeline  # the command imports it anyway: timed apart here
wall["pipeline import"] = time.perf_counter() - w1
cpu["pipeline import"] = time.process_time() - c1
stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
try:
    app(["analyze", *sys.argv[1:]], standalone_mode=False)
finally:
    sys.stdout.close()
    sys.stdout = stdout
w2, c2 = time.perf_counter(), time.process_time()
assert "analyze" in wall, "cptrace analyze did not call analyzers.analyze"
for table, spent in ((wall, w2 - w1), (cpu, c2 - c1)):
    table["render + rest"] = spent - table["analyze"] - table["pipeline import"]
own = resource.getrusage(resource.RUSAGE_SELF)
status = open("/proc/self/status").read()
hwm = [int(ln.split()[1]) / 1024 for ln in status.splitlines() if ln.startswith("VmHWM:")]
print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": hwm[0] if hwm else own.ru_maxrss / 1024}))
if hasattr(cptrace.cli, "exit_now"):  # the console script's exit, where the tree has one
    cptrace.cli.exit_now(0)
"""
"""One ``cptrace analyze`` in a fresh interpreter (``python -c``, nothing else imported),
stdout to /dev/null; the pipeline's import (which the command makes anyway) and the library
call (``analyzers.analyze``, wrapped) timed apart; prints one JSON line."""


PACKAGES = ("analyzers", "contracts", "cptrace", "pr_bot")
"""The tree's packages a ``cptrace analyze`` process imports."""


def byte_compile(tree: Path) -> None:
    """Write ``tree``'s bytecode (``__pycache__``, git-ignored) before timing a whole process.

    Why: an installed cptrace has its ``.pyc`` files; a worktree run with
    ``PYTHONDONTWRITEBYTECODE=1`` (this machine's environment) compiles every module from
    source in every process, about 0.1 s CPU of the CLI's import that no user pays.
    """
    packages = [p for p in PACKAGES if (tree / p).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], cwd=tree,
                   capture_output=True, check=True)  # fmt: skip


def run_cli_child(tree: Path, argv: list[str]) -> dict[str, Any]:
    """``CLI_CHILD`` in a fresh process of ``tree``: its JSON plus the process's wall time and
    the rows derived from it (see the module docstring)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-c", CLI_CHILD, *argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
    process_wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: CLI child failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall"]["process"] = process_wall
    # the child's whole CPU time, its exit included (the interpreter's teardown, if any)
    result["cpu"]["process"] = (after.ru_utime + after.ru_stime) - (
        before.ru_utime + before.ru_stime
    )
    for table in (result["wall"], result["cpu"]):
        table["outside analyze"] = table["process"] - table["analyze"]
        table["start, CLI import, exit"] = (
            table["outside analyze"] - table["pipeline import"] - table["render + rest"]
        )
    return result


def cli_args(paths: list[Path], step_pattern: str, sections: list[str]) -> list[str]:
    """``cptrace analyze``'s arguments for one input."""
    return [*map(str, paths), "--step-pattern", step_pattern,
            *(a for s in sections for a in ("--report", s))]  # fmt: skip


def _print_rows(first: str, rows: Sequence[str], runs: dict[str, list[dict[str, Any]]]) -> None:
    """The markdown table of one median cpu/wall pair per tree and row (deltas for two trees)."""
    names = list(runs)
    head = [first]
    for name in names:
        head += [f"{name} cpu s", f"{name} wall s"]
    if len(names) == 2:
        head += ["cpu delta", "wall delta"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [row]
        values = {}
        for name in names:
            c, w = _median(runs[name], "cpu", row), _median(runs[name], "wall", row)
            values[name] = (c, w)
            cells += [f"{c:.3f}", f"{w:.3f}"]
        if len(names) == 2:
            (bc, bw), (cc, cw) = values[names[0]], values[names[1]]
            cells += [_delta(bc, cc), _delta(bw, cw)]
        print("| " + " | ".join(cells) + " |")


def _cli_table(label: str, runs: dict[str, list[dict[str, Any]]]) -> None:
    names = list(runs)
    print(f"\n{label}: the whole `cptrace analyze` process; median of "
          f"{len(runs[names[-1]])} fresh processes per tree, alternating")  # fmt: skip
    _print_rows("part", CLI_ROWS, runs)
    rss = " | ".join(f"{n} {statistics.median(r['rss_mb'] for r in runs[n]):.0f}" for n in names)
    print(f"peak RSS MiB (median): {rss}; target: outside analyze <= 0.15 s")


def _peak_rss_mb(fallback: float) -> float:
    """This process's peak RSS: ``VmHWM`` (reset by exec), not ``ru_maxrss``, which Linux keeps
    across exec, so a child would report its parent's peak when that is larger."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return fallback
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return fallback


def _run_child(tree: Path, paths: list[Path], step_pattern: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, __file__, "--child", step_pattern, *map(str, paths)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: child failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median(runs: list[dict[str, Any]], clock: str, row: str) -> float:
    return statistics.median(r[clock][row] for r in runs)


def _table(label: str, runs: dict[str, list[dict[str, Any]]]) -> None:
    names = list(runs)
    first = runs[names[-1]][0]
    print(
        f"\n{label}: {first['activities']:,} activities, {first['windows']} windows; "
        f"median of {len(runs[names[-1]])} fresh processes per tree, alternating"
    )
    _print_rows("stage", ROWS, runs)
    rss = " | ".join(f"{n} {statistics.median(r['rss_mb'] for r in runs[n]):.0f}" for n in names)
    print(f"peak RSS MiB (median): {rss}")
    current = runs[names[-1]]
    share = [r["cpu"]["account"] / max(r["cpu"]["w/o account"], 1e-9) for r in current]
    wshare = [r["wall"]["account"] / max(r["wall"]["w/o account"], 1e-9) for r in current]
    print(
        f"account adds ({names[-1]}): {100 * statistics.median(share):.1f}% cpu, "
        f"{100 * statistics.median(wshare):.1f}% wall (per run: "
        + ", ".join(f"{100 * s:.1f}%" for s in share)
        + "; target <= 20%)"
    )


def _delta(base: float, current: float) -> str:
    if base <= 0:
        return "n/a"
    return f"{100 * (current / base - 1):+.1f}%"


def _inputs(which: list[str], large: Path, tmp: Path) -> list[tuple[str, list[Path], str]]:
    out = []
    for name in which:
        if name == "pair":
            out.append(("kineto pair (HTA comparison traces)", PAIR, "^arm:"))
        elif name == "x10":
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from hta_compare import _scaled_copy

            scaled = [tmp / p.name for p in PAIR]
            for source, target in zip(PAIR, scaled, strict=True):
                _scaled_copy(source, target, 10)
            out.append(("kineto pair, events x10", scaled, "^arm:"))
        elif name == "nsys":
            out.append(("nsys 3 arms", [NSYS], "^nsys_arm:"))
        elif name == "nsys2m":
            if not large.exists():
                raise SystemExit(
                    f"{large}: missing; build it with benchmarks/make_large_nsys.py "
                    "--kernels 2000000"
                )
            out.append((f"nsys {large.name}", [large], "^nsys_arm:"))
    return out


GUARDED = [*STAGES, "total"]
"""Rows the guard mode checks (``other`` and ``w/o account`` are derived from them)."""


def guard_failures(
    runs: dict[str, list[dict[str, Any]]], threshold: float, floor: float
) -> list[str]:
    """The guarded rows whose median CPU time grew past ``threshold`` (and ``floor`` seconds)
    from the ``base`` runs to the ``current`` ones, each as a readable line."""
    failures = []
    for row in GUARDED:
        base, current = _median(runs["base"], "cpu", row), _median(runs["current"], "cpu", row)
        if current - base > floor and current > base * (1 + threshold):
            failures.append(
                f"{row}: {base:.3f} s -> {current:.3f} s cpu ({_delta(base, current)}, "
                f"limit +{100 * threshold:.0f}%)"
            )
    return failures


@contextlib.contextmanager
def commit_tree(commit: str) -> Iterator[Path]:
    """A detached worktree of ``commit`` of this repository, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="cptrace-guard-") as tmp:
        tree = Path(tmp) / "base"
        added = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
            capture_output=True,
            text=True,
        )
        if added.returncode != 0:
            raise SystemExit(f"--guard {commit}: git worktree add failed: {added.stderr.strip()}")
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--base", type=Path, help="source tree to pair against (a worktree)")
    where.add_argument(
        "--guard",
        metavar="COMMIT",
        help="pair against a worktree of COMMIT; exit 1 when a stage's median CPU time grows "
        "by more than --threshold",
    )
    parser.add_argument("--threshold", type=float, default=0.10, help="guard: growth limit")
    parser.add_argument(
        "--floor", type=float, default=0.005, help="guard: growth in seconds never counted"
    )
    parser.add_argument(
        "--input",
        action="append",
        choices=["pair", "x10", "nsys", "nsys2m"],
        help="inputs (default: pair and nsys)",
    )
    parser.add_argument("--large", type=Path, default=LARGE)
    parser.add_argument("--repeat", type=int, default=3, help="runs per tree and input")
    parser.add_argument(
        "--cli", action="store_true", help="also time the whole `cptrace analyze` process"
    )
    parser.add_argument(
        "--report", action="append", default=[], help="CLI mode: analyze --report SECTION"
    )
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[1:], args.child[0])))
        return 0
    if args.guard:
        with commit_tree(args.guard) as tree:
            failures = _measure(args, tree, guard=True)
        print(f"guard against {args.guard}: " + ("FAIL" if failures else "pass"))
        for line in failures:
            print(f"  {line}")
        return 1 if failures else 0
    _measure(args, args.base.resolve() if args.base else None, guard=False)
    return 0


def _measure(args: argparse.Namespace, base: Path | None, *, guard: bool) -> list[str]:
    """Run and print every input's table; with ``guard``, the guard's failures per input."""
    trees = {"base": base} if base else {}
    trees["current"] = ROOT
    failures: list[str] = []
    for tree in trees.values():
        byte_compile(tree)
    print(f"load average before: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="cptrace-stages-") as tmp:
        for label, paths, pattern in _inputs(args.input or ["pair", "nsys"], args.large, Path(tmp)):
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for _ in range(args.repeat):  # ABAB: both trees see the same drift in load
                for name, tree in trees.items():
                    runs[name].append(_run_child(tree, paths, pattern))
            _table(label, runs)
            if args.cli:
                argv = cli_args(paths, pattern, args.report)
                cli_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
                for _ in range(args.repeat):
                    for name, tree in trees.items():
                        cli_runs[name].append(run_cli_child(tree, argv))
                _cli_table(label, cli_runs)
            if guard:
                found = guard_failures(runs, args.threshold, args.floor)
                failures += [f"{label}: {line}" for line in found]
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return failures


if __name__ == "__main__":
    raise SystemExit(main())
