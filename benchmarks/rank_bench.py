"""A multi-rank run analysed in one process vs as queue tasks shared by W workers.

What it measures, for R ranks: the wall time of the service's analysis of the run, the CPU
time of all its processes (user + system, their start and imports included: the stable number
on a loaded machine), and the peak RSS of its largest process (``RUSAGE_CHILDREN``'s
``ru_maxrss``; each arm runs in a fresh process of its own so nothing else counts). Arms:

============== ==============================================================================
one process    ``service.analysis_exec.run_isolated``: the whole run in one child (as before)
W (a count)    W ``cptrace worker`` processes on one PostgreSQL database (a throwaway server
               started here, a fresh database per trial) and one blob folder: the run is
               uploaded through the API (its validation untimed, the workers idle already),
               split into R rank tasks and a merge task (``service.storage.tasks``), timed
               from the upload's answer to the report stored. Each worker runs under a small
               wrapper whose ``RUSAGE_CHILDREN`` gives that worker's peak RSS (its largest
               process: a rank task's child, or the merge's) and CPU; the table shows each
               worker's peak and how many workers took rank tasks
============== ==============================================================================

Then, each in a fresh process of its own, that process's peak RSS: the libraries alone, one
rank's stage alone (read, attribute, write the part blob), the merge alone (of parts written
beforehand, loaded one at a time: ``merge_part_blobs``): where the per-rank split bounds memory
(the stage) and where it does not yet (the merge still builds the run's tables and runs the
stages after attribution over them). The ``merge-stages`` arm is the merge again, each of its
stages timed and its peak RSS taken on its own (the kernel's high-water mark reset before it,
``/proc/self/clear_refs``): what each stage adds over what the merge held when it began, and
what it leaves held: where the merge's growth with the rank count comes from.

Input: the real TE 2.20.2 Kineto pair (``tests/data/te-2.20.2-h200x2``, ~100k events and
~2,900 kernels a rank), copied to R ranks (``distributedInfo.rank`` rewritten; R/2 copies of
each real rank). Not nsys: an nsys export numbers its ranks by device order within itself, so
R exports of one rank each all claim rank 0 (a ``RankConflictError``), and one export of R
processes is one file, one part. Every arm's report is checked equal to the first arm's
(sha256 of its JSON). Arms alternate (ABAB over ``--repeat``) so a shared machine's load moves
them alike. ``--ranks`` takes several counts (``16,32``): a table each, then the peaks side by
side.

Usage::

    python benchmarks/rank_bench.py --ranks 8,16,32 --arms one,1,2,4
    python benchmarks/rank_bench.py --ranks 4 --workers 1,2 --repeat 2
    python benchmarks/rank_bench.py --ranks 16,32 --arms imports,stage,merge --repeat 2
    python benchmarks/rank_bench.py --ranks 8,16,32 --arms merge-stages
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TE = ROOT / "tests" / "data" / "te-2.20.2-h200x2"
LIMIT_BYTES = 16 << 30
Row = dict[str, Any]


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


def run_arm(arm: str, folder: Path, database: str = "") -> Row:
    """One service arm in this process: ``one`` (the whole run in one limited child) or a
    worker count W (W ``cptrace worker`` processes sharing the run's queue tasks on the
    PostgreSQL ``database``). CPU: all the processes the arm started (``RUSAGE_CHILDREN``)."""
    sys.path.insert(0, str(ROOT))
    from analyzers.readers import TraceInput
    from service.analysis_exec import run_isolated

    files = sorted(folder.glob("kineto_rank*.json.gz"), key=lambda p: int(p.name[11:-8]))
    if arm != "one":
        return _queue_arm(int(arm), files, database)
    limits: dict[str, Any] = {
        "time_limit_s": 3600,
        "memory_limit_bytes": LIMIT_BYTES,
        "max_decompressed_bytes": 64 << 30,
    }
    inputs = [  # as the worker types the uploaded files: the same report
        TraceInput(path=p, format="kineto", gzipped=True, rank=i, label=f"traces/{p.name}")
        for i, p in enumerate(files)
    ]
    started = time.perf_counter()
    report = run_isolated(inputs, _manifest(files), progress=lambda _m: None, **limits)
    wall = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_s": wall,
        "cpu_s": children.ru_utime + children.ru_stime,
        "peak_mib": children.ru_maxrss / 1024,
        "worker_peaks_mib": [],
        "report": _digest(report.model_dump_json()),
    }


def _digest(report_json: str) -> str:
    return hashlib.sha256(report_json.encode()).hexdigest()


_WORKER = """
import json, resource, signal, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
child.wait()
use = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu_s": use.ru_utime + use.ru_stime, "peak_mib": use.ru_maxrss / 1024}))
"""
"""A worker's wrapper: its ``RUSAGE_CHILDREN`` is the worker's and its analysis children's
(each rank task's and the merge's), once the worker ended."""


def _queue_arm(workers: int, files: list[Path], database: str) -> Row:
    """W workers on one PostgreSQL database and one blob folder; the run uploaded through the
    API (validation untimed, the workers already idle), timed from its upload's answer to its
    report stored; each worker's peak RSS (its largest process) and CPU after it stopped."""
    import sqlalchemy as sa
    from fastapi.testclient import TestClient

    from service.auth import Role, create_token
    from service.core.config import Settings
    from service.main import create_app
    from service.storage import runs, schema
    from service.storage.engine import execute

    data_dir = Path(tempfile.mkdtemp(prefix="rank-bench-data-"))
    os.environ.update(
        {
            "CPTRACE_ANALYSIS_RANK_WORKERS": "1",  # a worker: one rank task at a time
            "CPTRACE_ANALYSIS_PER_RANK_MIN_BYTES": "0",
            "CPTRACE_ANALYSIS_MEMORY_LIMIT_BYTES": str(LIMIT_BYTES),
            "CPTRACE_MAX_DECOMPRESSED_BYTES": str(64 << 30),
            "CPTRACE_MAX_UPLOAD_BYTES": str(16 << 30),
        }
    )
    settings = Settings(data_dir=data_dir, ingest_workers=0, database_url=database)
    app = create_app(settings)
    db = app.state.db
    argv = [sys.executable, "-c", "from cptrace.cli import main; main()", "worker"]
    argv += ["--data-dir", str(data_dir), "--database", database]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(workers)
    ]
    beats = sa.select(sa.func.count()).select_from(schema.worker_heartbeats)
    while db.read(lambda c: execute(c, beats).scalar()) < workers:
        time.sleep(0.1)
    members = [("manifest.json", json.dumps(_manifest(files)).encode())]
    bundle = _tar_gz(members + [(f"traces/{p.name}", p.read_bytes()) for p in files])
    token = db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with TestClient(app) as client:
        answer = client.post(
            "/api/v1/uploads/bundles",
            files={"bundle": ("b.tar.gz", bundle)},
            headers={"Authorization": f"Bearer {token}"},
        )
    started = time.perf_counter()
    if answer.status_code != 201:
        raise SystemExit(f"upload refused: {answer.status_code} {answer.text}")
    run_id = int(answer.json()["run_id"])
    state = sa.select(schema.runs.c.status, schema.runs.c.error).where(schema.runs.c.id == run_id)
    while (run := db.read(lambda c: execute(c, state).first()))["status"] != "analysed":
        if run["status"] == "failed":
            raise SystemExit(f"the analysis failed: {run['error']}")
        time.sleep(0.05)
    wall = time.perf_counter() - started
    report = db.read(lambda c: runs.report_json(c, run_id=run_id))
    t = schema.analysis_tasks.c
    ranks = db.read(lambda c: execute(c, sa.select(t.worker).where(t.kind == "rank")).rows)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    used = [json.loads(proc.communicate(timeout=120)[0].strip().splitlines()[-1]) for proc in procs]
    db.close()
    shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "wall_s": wall,
        "cpu_s": sum(u["cpu_s"] for u in used),
        "peak_mib": max(u["peak_mib"] for u in used),
        "worker_peaks_mib": sorted((u["peak_mib"] for u in used), reverse=True),
        "sharing": len({r["worker"] for r in ranks}),
        "report": _digest(report or ""),
    }


def _manifest(files: list[Path]) -> dict[str, Any]:
    """The run's bundle manifest: file i is rank i."""
    return {
        "schema_version": 1,
        "bundle_version": 1,
        "run": {
            "name": "rank-bench", "branch": "main", "commit": "abc123",
            "created_at": "2026-01-01", "host": "bench",
        },
        "traces": [
            {
                "path": f"traces/{p.name}", "format": "kineto", "rank": i,
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
            }
            for i, p in enumerate(files)
        ],
    }  # fmt: skip


def _tar_gz(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def own_peak_mib(field: str = "VmHWM") -> float:
    """This process's peak RSS since its ``exec`` or the last ``reset_peak`` (``VmHWM``;
    ``ru_maxrss`` would carry the high-water mark of the process it was forked from), or with
    ``field="VmRSS"`` its RSS now."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    """Start this process's ``VmHWM`` again from its RSS now (Linux ``clear_refs`` 5)."""
    Path("/proc/self/clear_refs").write_text("5")


MERGE_STAGES = (
    ("analyzers.rank_parts", "merge_traces", "the run's tables (parts copied in)"),
    ("analyzers.pipeline", "choose_steps", "step choice"),
    ("analyzers.pipeline", "find_windows", "windows"),
    ("analyzers.pipeline", "compute_metrics", "metrics"),
    ("analyzers.pipeline", "compute_accounts", "accounts"),
    ("analyzers.pipeline", "host_time", "host time"),
    ("analyzers.pipeline", "timeline_gaps", "timeline gaps"),
    ("analyzers.pipeline", "summarize", "summary"),
)
"""The merge's stages as ``merge_parts``/``analyze_attributed`` call them (module, name)."""


def timed_stages(log: list[Row]) -> None:
    """Wrap each of ``MERGE_STAGES`` where it is called so that a call appends its CPU time,
    the RSS it began with, its peak and the RSS it left to ``log``."""
    import importlib

    for module_name, name, title in MERGE_STAGES:
        module = importlib.import_module(module_name)
        inner = getattr(module, name)

        def timed(*args: Any, _inner: Any = inner, _title: str = title, **kwargs: Any) -> Any:
            before, so_far = own_peak_mib("VmRSS"), own_peak_mib()
            reset_peak()
            cpu = time.process_time()
            out = _inner(*args, **kwargs)
            log.append(
                {
                    "stage": _title,
                    "peak_so_far_mib": so_far,
                    "cpu_s": time.process_time() - cpu,
                    "before_mib": before,
                    "peak_mib": own_peak_mib(),
                    "after_mib": own_peak_mib("VmRSS"),
                }
            )
            return out

        setattr(module, name, timed)


def run_stage(stage: str, folder: Path) -> Row:
    """One process's own peak RSS and CPU: the libraries alone (``imports``), one rank's stage
    (``stage``: read, attribute, write the part) or the merge of parts written beforehand."""
    sys.path.insert(0, str(ROOT))
    from analyzers.rank_parts import analyze_rank, dump_part, merge_part_blobs
    from analyzers.readers import trace_input

    files = sorted(folder.glob("kineto_rank*.json.gz"))
    blobs = [folder / f"part{i}.npz" for i in range(len(files))]
    stages: list[Row] = []
    if stage == "merge-stages":
        timed_stages(stages)
    if stage in ("merge", "merge-stages"):
        for path, blob in zip(files, blobs, strict=True):  # each by a process of its own
            code = _PART.format(path=path, blob=blob, files=len(files))
            if not blob.exists():
                subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    started, cpu = time.perf_counter(), time.process_time()
    merged = None
    if stage == "stage":
        dump_part(analyze_rank(trace_input(files[0]), files=len(files)), folder / "one.npz")
    elif stage in ("merge", "merge-stages"):
        merged = merge_part_blobs(blobs)
    row = {
        "stages": stages,
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu,
        # with stages timed, the process's peak is the largest of the marks they reset
        "peak_mib": max(
            [own_peak_mib()] + [r[k] for r in stages for k in ("peak_so_far_mib", "peak_mib")]
        ),
        "report": stage,
    }
    if merged is not None:  # after the peak is taken: the JSON is the report's size, not a stage
        row["report_mib"] = len(merged.report.model_dump_json()) / 2**20
    return row


_PART = (
    "from pathlib import Path; from analyzers.rank_parts import analyze_rank, dump_part; "
    "from analyzers.readers import trace_input; "
    "dump_part(analyze_rank(trace_input(Path('{path}')), files={files}), Path('{blob}'))"
)
STAGES = ("imports", "stage", "merge", "merge-stages")


def label(arm: str) -> str:
    names = {
        "one": "service, before: one process",
        "imports": "the libraries alone (one process; CPU: imports excluded)",
        "stage": "one rank's stage alone (imports excluded)",
        "merge": "the merge alone (imports excluded)",
        "merge-stages": "the merge alone, its stages timed one by one",
    }
    return names.get(arm, f"service: {arm} worker(s) sharing the rank tasks and the merge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="4", help="comma-separated rank counts")
    parser.add_argument("--workers", default="1,2", help="comma-separated process counts")
    parser.add_argument(
        "--arms",
        help="comma-separated arms (one, the worker counts, imports, stage, merge); default all",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--database", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm == "make":
        make_ranks(args.dir, int(args.ranks))
    elif args.arm in STAGES:
        print(json.dumps(run_stage(args.arm, args.dir)))
    elif args.arm:
        print(json.dumps(run_arm(args.arm, args.dir, args.database)))
    else:
        arms = args.arms.split(",") if args.arms else ["one", *args.workers.split(","), *STAGES]
        counts = [int(r) for r in args.ranks.split(",")]
        with contextlib.ExitStack() as stack:
            databases = _databases(stack, any(a.isdigit() for a in arms))
            peaks = {count: report(count, arms, args.repeat, databases) for count in counts}
        if len(counts) > 1:
            print("\npeak RSS, MiB, by rank count")
            print("| arm | " + " | ".join(f"{c} ranks" for c in counts) + " |")
            print("|---|" + "---|" * len(counts))
            for arm in arms:
                print(
                    f"| {label(arm)} | " + " | ".join(f"{peaks[c][arm]:.0f}" for c in counts) + " |"
                )


def _databases(stack: contextlib.ExitStack, needed: bool) -> Callable[[], str]:
    """A new empty PostgreSQL database per worker-arm trial, on a throwaway server started
    here (Debian's ``postgresql``, as ``make test`` starts it: ``tests/service``)."""
    if not needed:
        return str
    sys.path.insert(0, str(ROOT / "tests" / "service"))
    from postgres_server import postgres_missing, running_postgres

    missing = postgres_missing()
    if missing is not None:
        raise SystemExit(f"the worker arms need PostgreSQL: {missing}")
    server = stack.enter_context(running_postgres())
    return server.new_database


def report(
    ranks: int, arms: list[str], repeat: int, databases: Callable[[], str]
) -> dict[str, float]:
    """One rank count's table; returns each arm's median peak RSS (MiB)."""
    results: dict[str, list[Row]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="rank-bench-") as tmp:
        # the inputs are made in a process of their own: this one stays small, so the arms it
        # forks start small (a forked process's ru_maxrss starts at its parent's)
        own = [sys.executable, __file__, "--dir", tmp, "--ranks", str(ranks), "--arm"]
        subprocess.run([*own, "make"], check=True)
        size = sum(p.stat().st_size for p in Path(tmp).glob("kineto_rank*.json.gz")) / 2**20
        for _ in range(repeat):
            for arm in arms:
                database = ["--database", databases()] if arm.isdigit() else []
                done = subprocess.run(
                    [*own, arm, *database], capture_output=True, text=True, check=True
                )
                results[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
    digests = {r["report"] for arm in arms if arm not in STAGES for r in results[arm]}
    print(
        f"{ranks} ranks, {size:.1f} MiB of gzipped Kineto JSON; reports identical: "
        f"{len(digests) <= 1}; medians of {repeat}"
    )
    print(
        "| arm | wall s | CPU s, all its processes | peak RSS of its largest process, MiB "
        "| peak RSS per worker, MiB | workers that took rank tasks |"
    )
    print("|---|---|---|---|---|---|")
    peaks = {}
    for arm, rows in results.items():
        wall, cpu, peak = (
            statistics.median(float(r[key]) for r in rows)
            for key in ("wall_s", "cpu_s", "peak_mib")
        )
        peaks[arm] = peak
        first = rows[0]
        each = " / ".join(f"{p:.0f}" for p in first.get("worker_peaks_mib", []))
        print(
            f"| {label(arm)} | {wall:.2f} | {cpu:.2f} | {peak:.0f} | {each or '-'} "
            f"| {first.get('sharing', '-')} |"
        )
    if results.get("merge-stages"):
        print_stages(results["merge-stages"][0])
    return peaks


def print_stages(merge: Row) -> None:
    """The merge's stages, each: CPU, the RSS it began with, its own peak above it, and what
    it left held (MiB); then the size of the report's JSON (the models the merge holds until
    the report is built are several times that)."""
    stages = merge["stages"]
    print("| merge stage | CPU s | RSS before, MiB | its peak above that | held after it |")
    print("|---|---|---|---|---|")
    for row in stages:
        print(
            f"| {row['stage']} | {row['cpu_s']:.2f} | {row['before_mib']:.0f} | "
            f"{row['peak_mib'] - row['before_mib']:+.0f} | "
            f"{row['after_mib'] - row['before_mib']:+.0f} |"
        )
    print(f"report JSON: {merge['report_mib']:.1f} MiB")


if __name__ == "__main__":
    main()
