"""Read time and peak memory of one Kineto trace written in different JSON layouts.

The same events, re-serialized the ways other tools write them: Kineto's own line layout (the
fast path), ``json.dump(obj, indent=1)``, ``indent=2``, ``indent=4``, sorted keys (indented
and compact), compact separators, Kineto's layout with CRLF line ends, and gzip'd files (Kineto's
layout and ``indent=2``). Each read (``read_kineto``) runs in a fresh subprocess that reports
its wall time, its CPU time (``time.process_time``) and its peak RSS (``ru_maxrss``, interpreter
and imports included; "read MB" is the peak minus the peak before the read, i.e. what the read
itself added); the layouts are written by a subprocess too, so the readers do not inherit the
writer's memory. Every round reads every layout once, in a shuffled order, so load changes on
the machine hit every layout alike; the table shows the median of ``--repeat`` rounds and the
CPU-time ratio to Kineto's layout with the same compression (CPU time, because the shared
development machine's wall time mostly measures the other users); "paired" is the median over
rounds of each round's own ratio. The issue asks for at most
1.5x on every layout.

Exactness: each reader prints a digest of everything it read (the three tables, the GPU ranges,
the string table, span, ranks, notes, metadata except the parser's name); the script fails if
any layout's digest differs from Kineto's layout's.

    .venv/bin/python benchmarks/kineto_layouts.py                 # the TE reference rank 0
    .venv/bin/python benchmarks/kineto_layouts.py --trace x.json.gz --repeat 5
    .venv/bin/python benchmarks/kineto_layouts.py --base main --repeat 5   # paired with main

gzip: a gzipped layout's child also times inflating the file alone (``_files.file_blocks``,
the reader's own inflate, in the same process after the read); "gunzip s" is that CPU time and
"w/o gunzip" the JSON MB/s of the read without it, so the JSON read and what gzip costs are
stated apart.

``--base COMMIT``: every read also runs in a temporary detached worktree of ``COMMIT`` (the
same helper as ``analyze_stages.py --guard``), right before or after the same read in this
tree (the order alternates), so both see the same load; the table gains the base's CPU s and
the median over rounds of each pair's CPU ratio; the script fails if the base read a layout
differently from this tree. The load average is printed before and after.

Prints a table; it asserts nothing (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from analyze_stages import commit_tree  # noqa: E402  (one worktree helper)

DEFAULT_TRACE = ROOT / "tests/data/te-2.20.2-h200x2/kineto_3arms_rank0.json.gz"

_CHILD = """
import hashlib, json, resource, sys, time
from analyzers.readers.kineto import read_kineto
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
wall, used = time.perf_counter(), time.process_time()
trace = read_kineto(sys.argv[1], rank=0)
wall, used = time.perf_counter() - wall, time.process_time() - used
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
digest = hashlib.sha256()
for table in (trace.activities, trace.launches, trace.ranges, trace.gpu_ranges):
    digest.update(table.dtype.str.encode() + table.tobytes())
facts = {k: v for k, v in trace.metadata.items() if k != "json_parser"}
rest = [trace.strings.names, trace.span, sorted(trace.ranks.items()), trace.notes,
        sorted(trace.thread_names.items()), facts]
digest.update(json.dumps(rest, sort_keys=True, default=str).encode())
gunzip = 0.0
if sys.argv[1].endswith(".gz"):  # the reader's own inflate alone, after the read
    from pathlib import Path
    from analyzers.readers._files import file_blocks
    gunzip = time.process_time()
    for _ in file_blocks(Path(sys.argv[1]), 1 << 40):
        pass
    gunzip = time.process_time() - gunzip
print(json.dumps({"wall": wall, "cpu": used, "peak": peak, "base": before, "gunzip": gunzip,
                  "parser": trace.metadata["json_parser"], "digest": digest.hexdigest(),
                  "rows": len(trace.activities) + len(trace.launches) + len(trace.ranges)}))
"""

_WRITER = """
import gzip, json, sys
from pathlib import Path
source, out = Path(sys.argv[1]), Path(sys.argv[2])
raw = gzip.decompress(source.read_bytes()) if source.name.endswith(".gz") else source.read_bytes()
doc = json.loads(raw)
variants = {
    "indent=1": {"indent": 1},
    "indent=2": {"indent": 2},
    "indent=4": {"indent": 4},
    "indent=2, sorted keys": {"indent": 2, "sort_keys": True},
    "compact": {"separators": (",", ":")},
    "compact, sorted keys": {"separators": (",", ":"), "sort_keys": True},
}
texts = {"kineto (own)": raw}
texts.update({name: json.dumps(doc, **options).encode() for name, options in variants.items()})
texts["kineto (own), CRLF"] = raw.replace(b"\\n", b"\\r\\n")
files = {}
for index, (name, text) in enumerate(texts.items()):
    files[name] = out / f"layout{index}.json"
    files[name].write_bytes(text)
    if name in ("kineto (own)", "indent=2"):
        files[name + ", gzip"] = out / f"layout{index}.json.gz"
        files[name + ", gzip"].write_bytes(gzip.compress(text, compresslevel=6))
print(json.dumps({name: str(path) for name, path in files.items()}))
"""

BASE = "kineto (own)"
BASE_GZ = "kineto (own), gzip"


def _layouts(trace: Path, out: Path) -> dict[str, Path]:
    """Write the layouts (in a subprocess: the readers must not inherit its memory)."""
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(trace), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    files: dict[str, str] = json.loads(done.stdout)
    return {name: Path(path) for name, path in files.items()}


def _text_bytes(path: Path) -> int:
    """Bytes of JSON text the read parses (a gzip file's decompressed size)."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return sum(len(block) for block in iter(lambda: fh.read(1 << 20), b""))
    return path.stat().st_size


def _measure(path: Path, tree: Path = ROOT) -> dict[str, float | str | int]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    result: dict[str, float | str | int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _paired(
    items: list[dict[str, float | str | int]], base: list[dict[str, float | str | int]]
) -> float:
    """Median over rounds of the CPU time over the same round's Kineto-layout CPU time (each
    round's load hits both alike)."""
    return statistics.median(
        float(r["cpu"]) / float(b["cpu"]) for r, b in zip(items, base, strict=True)
    )


Runs = dict[str, list[dict[str, float | str | int]]]


@contextmanager
def _base_tree(commit: str | None) -> Iterator[Path | None]:
    with commit_tree(commit) if commit else nullcontext() as tree:  # type: ignore[attr-defined]
        yield tree


def _load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base", help="a commit to pair every read with (a temporary worktree)")
    args = parser.parse_args()
    load_before = _load()
    with (
        tempfile.TemporaryDirectory(prefix="cptrace-layouts-") as tmp,
        _base_tree(args.base) as base_tree,
    ):
        files = _layouts(args.trace, Path(tmp))
        runs: Runs = {name: [] for name in files}
        base_runs: Runs = {name: [] for name in files}
        order = random.Random(0)
        for round_index in range(args.repeat):  # interleaved: load changes hit every layout alike
            names = list(files)
            order.shuffle(names)
            for turn, name in enumerate(names):
                if base_tree is None:
                    runs[name].append(_measure(files[name]))
                    continue
                pair = [(runs, ROOT), (base_runs, base_tree)]
                for into, tree in pair if (round_index + turn) % 2 == 0 else pair[::-1]:
                    into[name].append(_measure(files[name], tree))
        sizes = {name: path.stat().st_size for name, path in files.items()}
        texts = {name: _text_bytes(path) for name, path in files.items()}
    digests = {name: {str(r["digest"]) for r in items} for name, items in runs.items()}
    differ = [name for name, found in digests.items() if found != digests[BASE]]
    if differ:
        raise SystemExit(f"the read differs from Kineto's layout for: {', '.join(differ)}")
    if base_tree is not None:
        differ = [
            n for n, items in base_runs.items() if {str(r["digest"]) for r in items} != digests[n]
        ]
        if differ:
            raise SystemExit(f"{args.base} reads these layouts differently: {', '.join(differ)}")
    base = statistics.median(float(r["cpu"]) for r in runs[BASE])
    base_gz = statistics.median(float(r["cpu"]) for r in runs[BASE_GZ])
    print(f"trace: {args.trace} ({args.repeat} rounds, medians; every layout read the same)")
    print(f"load average {load_before} before, {_load()} after")
    paired = f" {'base CPU s':>10} {'vs base':>7}" if base_tree is not None else ""
    head = (
        f"{'layout':<22} {'MB':>6} {'parser':<15} {'rows':>7} {'wall s':>7} {'CPU s':>7} "
        f"{'JSON MB/s':>9} {'gunzip s':>8} {'w/o gunzip':>10} "
        f"{'peak RSS MB':>11} {'read MB':>7} {'CPU ratio':>9} {'paired':>7}{paired}"
    )
    print(head)
    print("-" * len(head))
    for name, items in runs.items():
        cpu = statistics.median(float(r["cpu"]) for r in items)
        wall = statistics.median(float(r["wall"]) for r in items)
        peak = statistics.median(float(r["peak"]) for r in items)
        grown = statistics.median(float(r["peak"]) - float(r["base"]) for r in items)
        gunzip = statistics.median(float(r.get("gunzip", 0.0)) for r in items)
        row = (
            f"{name:<22} {sizes[name] / 1e6:>6.1f} {items[0]['parser']!s:<15} "
            f"{items[0]['rows']!s:>7} {wall:>7.3f} {cpu:>7.3f} {texts[name] / 1e6 / cpu:>9.0f} "
            f"{gunzip:>8.3f} {texts[name] / 1e6 / (cpu - gunzip):>10.0f} "
            f"{peak / 1e6:>11.1f} "
            f"{grown / 1e6:>7.1f} "
            f"{cpu / (base_gz if name.endswith('gzip') else base):>8.2f}x "
            f"{_paired(items, runs[BASE_GZ if name.endswith('gzip') else BASE]):>6.2f}x"
        )
        if base_tree is not None:
            before = statistics.median(float(r["cpu"]) for r in base_runs[name])
            row += f" {before:>10.3f} {_paired(items, base_runs[name]):>6.2f}x"
        print(row)


if __name__ == "__main__":
    main()
