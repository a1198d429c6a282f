"""Are the reports unchanged? ``cptrace analyze`` of every real trace, a base commit vs this tree.

Why: a change to the readers (or anything below the report) that only makes them faster must
leave every report byte for byte as it was. This runs ``cptrace analyze INPUT --json --full``
and the text report (``cptrace analyze INPUT``, piped: the fixed 200-column width) in a fresh
process of each tree, and compares the sha256 of their stdout and their exit status.

Inputs: every real trace under ``tests/data`` and under each ``--traces DIR`` (e.g. the shared
traces folder), found by content of the folder:

* a folder holding ``manifest.json``: one input (a run bundle as a folder);
* ``*.tar.gz``: one input each (a run bundle);
* ``*.sqlite``, ``*.sqlite.gz``, ``*.nsys-rep``: one input each;
* ``*.json``, ``*.json.gz``: the files of one folder whose names differ only in ``rank<N>``
  are one trace set (analysed together, as the ranks of one run); every other file alone.

Each input is analysed with the default step pattern and once more per ``--step-pattern P``
(e.g. ``'^arm:'`` for the TE 2.20.2 arms). The base tree is a temporary detached worktree of
``--base`` (removed afterwards), run with this interpreter (the same packages).

Usage::

    .venv/bin/python benchmarks/report_identity.py --base main --step-pattern '^arm:'
    .venv/bin/python benchmarks/report_identity.py --base main --traces $TRACES

Prints one row per input, arguments and format; exits 1 when any differs (benchmarks are not
tests: this is the check a change's note cites).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from analyze_stages import byte_compile, commit_tree  # noqa: E402  (one worktree helper)

CLI = "import cptrace.cli as c; getattr(c, 'console_main', c.main)()"
"""The installed script's entry point (``console_main`` where the tree has it)."""
_RANK = re.compile(r"rank\d+")
_JSON = (".json", ".json.gz")
_ALONE = (".tar.gz", ".sqlite", ".sqlite.gz", ".nsys-rep")


def find_inputs(folder: Path) -> list[list[Path]]:
    """The trace inputs under ``folder`` (see the module docstring), in path order."""
    inputs: list[list[Path]] = []
    sets: dict[tuple[Path, str], list[Path]] = {}
    bundles = {m.parent for m in folder.rglob("manifest.json")}
    for path in sorted(folder.rglob("*")):
        if path.name == "manifest.json" and path.parent in bundles:
            inputs.append([path.parent])
        elif path.is_dir() or any(parent in bundles for parent in path.parents):
            continue
        elif path.name.endswith(_ALONE):
            inputs.append([path])
        elif path.name.endswith(_JSON):
            key = (path.parent, _RANK.sub("rank", path.name))
            if _RANK.search(path.name):
                if key not in sets:
                    inputs.append(sets.setdefault(key, []))
                sets[key].append(path)
            else:
                inputs.append([path])
    return inputs


def digest(tree: Path, argv: Sequence[str]) -> str:
    """sha256 (16 hex digits) and exit status of ``cptrace ARGV``'s stdout in ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", CLI, *argv], capture_output=True, env=env, cwd=tree
    )
    return f"{hashlib.sha256(done.stdout).hexdigest()[:16]} rc={done.returncode}"


def _label(paths: list[Path]) -> str:
    shown = []
    for p in paths:
        try:
            shown.append(str(p.relative_to(ROOT)))
        except ValueError:
            shown.append(p.name if len(paths) > 1 else str(p))
    return " + ".join(shown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="commit to compare against (e.g. main)")
    parser.add_argument("--traces", type=Path, action="append", default=[],
                        help="another folder of real traces (repeatable)")  # fmt: skip
    parser.add_argument("--step-pattern", action="append", default=[],
                        help="also analyse every input with this pattern (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    folders = [ROOT / "tests/data", *(t.resolve() for t in args.traces)]
    for folder in folders:
        if not folder.is_dir():
            raise SystemExit(f"--traces {folder}: not a folder")
    inputs: list[list[Path]] = []
    for folder in folders:
        inputs.extend(find_inputs(folder))
    patterns: list[list[str]] = [[], *(["--step-pattern", p] for p in args.step_pattern)]
    differ = 0
    with commit_tree(args.base) as base:
        for tree in (base, ROOT):
            byte_compile(tree)
        print(f"| input | step pattern | format | {args.base} | current | same |")
        print("|---|---|---|---|---|---|")
        for paths in inputs:
            for pattern in patterns:
                for name, extra in (("json --full", ["--json", "--full"]), ("text", [])):
                    argv_ = ["analyze", *map(str, paths), *pattern, *extra]
                    was, now = digest(base, argv_), digest(ROOT, argv_)
                    differ += was != now
                    shown = pattern[1] if pattern else "default"
                    print(f"| {_label(paths)} | {shown} | {name} | {was} | {now} | "
                          f"{'yes' if was == now else '**NO**'} |", flush=True)  # fmt: skip
    print(f"{differ} of {len(inputs) * len(patterns) * 2} reports differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
