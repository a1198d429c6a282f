"""A multi-rank run analysed in one process vs per rank (``service/rank_exec.py``).

What it measures, for R ranks: the wall time of the service's analysis of the run, and the
peak RSS of its largest process (``RUSAGE_CHILDREN``'s ``ru_maxrss``: the largest process the
arm started, the merge included; the arm runs in a fresh process of its own so nothing else
counts). Arms:

============== ==============================================================================
one process    ``service.analysis_exec.run_isolated``: the whole run in one child (as before)
per rank, W    ``service.rank_exec.run_per_rank`` with W processes reading and attributing one
               file each into a part blob, then one merge
============== ==============================================================================

Then, each in a fresh process of its own, that process's peak RSS: the libraries alone, one
rank's stage alone (read, attribute, write the part blob), the merge alone (of parts written
beforehand): where the per-rank split bounds memory (the stage) and where it does not yet (the
merge holds every rank's tables).

Input: the real TE 2.20.2 Kineto pair (``tests/data/te-2.20.2-h200x2``, ~100k events and
~2,900 kernels a rank), copied to R ranks (``distributedInfo.rank`` rewritten; R/2 copies of
each real rank). Every arm's report is checked equal to the first arm's (sha256 of its JSON).
Arms alternate (ABAB over ``--repeat``) so a shared machine's load moves them alike.

Usage::

    python benchmarks/rank_bench.py --ranks 4 --workers 1,2 --repeat 2
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TE = ROOT / "tests" / "data" / "te-2.20.2-h200x2"
LIMIT_BYTES = 16 << 30


def make_ranks(folder: Path, ranks: int) -> list[Path]:
    """R Kineto files: the real pair's events under ranks 0..R-1 (world size R)."""
    sources = [
        json.loads(gzip.decompress((TE / f"kineto_3arms_rank{i}.json.gz").read_bytes()))
        for i in (0, 1)
    ]
    out = []
    for rank in range(ranks):
        trace = dict(sources[rank % 2])
        trace["distributedInfo"] = {
            **trace.get("distributedInfo", {}),
            "rank": rank,
            "world_size": ranks,
        }
        path = folder / f"kineto_rank{rank}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(trace).encode(), compresslevel=1))
        out.append(path)
    return out


def run_arm(arm: str, folder: Path) -> dict[str, float | str]:
    """One arm in this process: the analysis, its wall time, the largest child's peak RSS."""
    sys.path.insert(0, str(ROOT))
    from analyzers.readers import trace_input
    from service.analysis_exec import run_isolated
    from service.rank_exec import run_per_rank

    inputs = [trace_input(p) for p in sorted(folder.glob("kineto_rank*.json.gz"))]
    scratch = Path(tempfile.mkdtemp(prefix="rank-bench-"))
    started = time.perf_counter()
    if arm == "one":
        report = run_isolated(
            inputs,
            None,
            time_limit_s=3600,
            memory_limit_bytes=LIMIT_BYTES,
            progress=lambda _m: None,
        )
    else:
        report = run_per_rank(
            inputs,
            None,
            scratch=scratch,
            workers=int(arm),
            time_limit_s=3600,
            memory_limit_bytes=LIMIT_BYTES,
            progress=lambda _m: None,
        )
    wall = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    parts = sum(p.stat().st_size for p in scratch.glob("part*.npz"))
    digest = hashlib.sha256(report.model_dump_json().encode()).hexdigest()
    return {
        "wall_s": wall,
        "peak_mib": peak_kib / 1024,
        "parts_mib": parts / 2**20,
        "report": digest,
    }


def run_stage(stage: str, folder: Path) -> dict[str, float | str]:
    """One process's own peak RSS (``RUSAGE_SELF``): the libraries alone (``imports``), the
    largest rank's stage (``stage``: read, attribute, write the part) or the merge."""
    sys.path.insert(0, str(ROOT))
    from analyzers.rank_parts import analyze_rank, dump_part, load_part, merge_parts
    from analyzers.readers import trace_input

    files = sorted(folder.glob("kineto_rank*.json.gz"))
    started = time.perf_counter()
    if stage == "stage":
        dump_part(analyze_rank(trace_input(files[0]), files=len(files)), folder / "one.npz")
    elif stage == "merge":
        blobs = []
        for i, path in enumerate(files):  # the parts, written by a process of their own
            blobs.append(folder / f"part{i}.npz")
            if not blobs[-1].exists():
                subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        _PART.format(path=path, blob=blobs[-1], files=len(files)),
                    ],
                    check=True,
                    cwd=ROOT,
                )
        started = time.perf_counter()
        merge_parts(load_part(b) for b in blobs)
    wall = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"wall_s": wall, "peak_mib": peak_kib / 1024, "parts_mib": 0.0, "report": stage}


_PART = (
    "from pathlib import Path; from analyzers.rank_parts import analyze_rank, dump_part; "
    "from analyzers.readers import trace_input; "
    "dump_part(analyze_rank(trace_input(Path('{path}')), files={files}), Path('{blob}'))"
)


def label(arm: str) -> str:
    names = {
        "one": "one process (service, before)",
        "imports": "  the libraries alone (one process)",
        "stage": "  one rank's stage alone",
        "merge": "  the merge alone",
    }
    return names.get(arm, f"per rank, {arm} process(es) (service, after)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--workers", default="1,2", help="comma-separated process counts")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm in ("imports", "stage", "merge"):
        print(json.dumps(run_stage(args.arm, args.dir)))
        return
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.dir)))
        return
    arms = ["one", *args.workers.split(","), "imports", "stage", "merge"]
    results: dict[str, list[dict[str, float | str]]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="rank-bench-") as tmp:
        folder = Path(tmp)
        files = make_ranks(folder, args.ranks)
        size = sum(p.stat().st_size for p in files) / 2**20
        for _ in range(args.repeat):
            for arm in arms:
                done = subprocess.run(
                    [sys.executable, __file__, "--arm", arm, "--dir", str(folder)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
    digests = {r["report"] for arm in arms[:-3] for r in results[arm]}
    print(
        f"{args.ranks} ranks, {size:.1f} MiB of gzipped Kineto JSON; reports identical: "
        f"{len(digests) == 1}"
    )
    print(
        f"| arm | wall s (median of {args.repeat}) | peak RSS of the largest process, MiB "
        "| part blobs, MiB |"
    )
    print("|---|---|---|---|")
    for arm, rows in results.items():
        wall = statistics.median(float(r["wall_s"]) for r in rows)
        peak = statistics.median(float(r["peak_mib"]) for r in rows)
        parts = statistics.median(float(r["parts_mib"]) for r in rows)
        print(f"| {label(arm)} | {wall:.2f} | {peak:.0f} | {parts:.1f} |")


if __name__ == "__main__":
    main()
