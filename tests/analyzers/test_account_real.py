"""The step account on the real TE 2.20.2 traces (2x H200, reference workload, 3 arms).

The host-bound idle time of ``get_cu_seqlens_on_cp_rank`` is computed a second time here from
the raw rows (plain ``sqlite3`` and a plain JSON walk, no analyzer code): the windows' GPU
activity union, its gaps, the launch that ends each gap, and the launching thread's helper
ranges and sync intervals at each instant of the gap. The rule it implements is the one
``docs/analyzers.md`` states: a gap is host-bound when the launch of the activity ending it had
not returned when the gap began; each instant ``t`` of it counts for the helper when the
thread is inside the helper's range (and not in a sync call) at ``min(t, cut - 1)``, ``cut``
being the launch's return (or the gap end); a gap at a window end goes to the previous
activity's launching thread.
"""

from __future__ import annotations

import bisect
import gzip
import json
import sqlite3
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path

import pytest

from analyzers.pipeline import Analysis
from analyzers.report import AccountPartKind as K
from tests.analyzers.conftest import KINETO_3ARMS, NSYS_3ARMS

HELPER = "get_cu_seqlens_on_cp_rank"
ARMS = ("auto_clone", "explicit_false", "auto_same")

Interval = tuple[int, int]


# ------------------------------------------------------------------------ the rule, plainly


def _measure(intervals: list[Interval], lo: int, hi: int) -> int:
    """Length of [lo, hi) inside the union of sorted, disjoint ``intervals``."""
    total = 0
    i = max(bisect.bisect_right(intervals, (lo, lo)) - 1, 0)
    while i < len(intervals) and intervals[i][0] < hi:
        s, e = intervals[i]
        total += max(0, min(e, hi) - max(s, lo))
        i += 1
    return total


def _contains(intervals: list[Interval], t: int) -> bool:
    return _measure(intervals, t, t + 1) == 1


def _disjoint(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` without ``b`` (both sorted and disjoint)."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def _helper_idle(
    window: Interval,
    activities: list[tuple[int, int, int | None]],
    launches: dict[int, tuple[int, int, int]],
    helper_time: dict[int, list[Interval]],
) -> int:
    """Host-bound idle ns of one window attributed to the helper.

    ``activities``: (start, end, launch key or None); ``launches``: key -> (start, end,
    thread); ``helper_time``: thread -> helper intervals minus sync intervals.
    """
    ws, we = window
    clipped = sorted(
        (max(s, ws), min(e, we), key)
        for s, e, key in activities
        if s < we and e > ws and e > s
    )
    pieces: list[list[int]] = []  # [start, end, index of first activity, index of last]
    for i, (s, e, _) in enumerate(clipped):
        if pieces and s <= pieces[-1][1]:
            if e > pieces[-1][1]:
                pieces[-1][1], pieces[-1][3] = e, i
        else:
            pieces.append([s, e, i, i])
    gaps: list[tuple[int, int, int | None, int | None]] = []  # start, end, next, prev
    edge = ws
    prev = None
    for s, e, first, last in pieces:
        if s > edge:
            gaps.append((edge, s, first, prev))
        edge, prev = e, last
    if we > edge:
        gaps.append((edge, we, None, prev))
    total = 0
    for g0, g1, nxt, prv in gaps:
        owner = nxt if nxt is not None else prv
        if owner is None:
            continue
        starts_here = [a for a in clipped if (a[0] == g1 if nxt is not None else a[1] == g0)]
        keys = [a[2] for a in starts_here if a[2] is not None and a[2] in launches]
        if len(keys) != len(starts_here) or not keys:
            continue
        _, le, thread = min(launches[k] for k in keys)
        if nxt is not None and le <= g0:
            continue  # queued before the gap: not host-bound
        cut = min(le, g1) if nxt is not None else g1
        mine = helper_time.get(thread, [])
        total += _measure(mine, g0, cut)
        if cut < g1 and _contains(mine, cut - 1):
            total += g1 - cut
    return total


# ------------------------------------------------------------------------ nsys, plain sqlite3


def _nsys_raw(path: Path) -> dict[tuple[int, str], int]:
    """(window start ns, arm) -> host-bound idle of the helper in that window."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "trace.sqlite"
        db.write_bytes(gzip.decompress(path.read_bytes()))
        conn = sqlite3.connect(db)
        try:
            return _nsys_rows(conn)
        finally:
            conn.close()


def _nsys_rows(conn: sqlite3.Connection) -> dict[tuple[int, str], int]:
    strings = dict(conn.execute("SELECT id, value FROM StringIds"))
    nvtx = [
        (s, e, tid, text if text is not None else strings.get(text_id, ""))
        for s, e, tid, text, text_id in conn.execute(
            "SELECT start, end, globalTid, text, textId FROM NVTX_EVENTS WHERE end IS NOT NULL"
        )
    ]
    launches: dict[tuple[int, int], tuple[int, int, int]] = {}
    for s, e, tid, corr in conn.execute(
        "SELECT start, end, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"
    ):
        launches.setdefault((tid & ~0xFFFFFF, corr), (s, e, tid))
    acts: dict[int, list[tuple[int, int, tuple[int, int]]]] = defaultdict(list)
    d2h: dict[int, list[Interval]] = defaultdict(list)  # thread -> blocking copy intervals
    for table in ("KERNEL", "MEMCPY", "MEMSET"):
        kind = ", copyKind" if table == "MEMCPY" else ", 0"
        for s, e, pid, corr, copy_kind in conn.execute(
            f"SELECT start, end, globalPid, correlationId{kind} FROM CUPTI_ACTIVITY_KIND_{table}"
        ):
            acts[pid].append((s, e, (pid, corr)))
            launch = launches.get((pid, corr))
            if table == "MEMCPY" and copy_kind == 2 and launch is not None:  # device to host
                d2h[launch[2]].append((launch[0], max(launch[1], e)))
    helper: dict[int, list[Interval]] = defaultdict(list)
    for s, e, tid, name in nvtx:
        if name.endswith(HELPER):
            helper[tid].append((s, e))
    helper_time = {t: _minus(_disjoint(v), _disjoint(d2h.get(t, []))) for t, v in helper.items()}
    out = {}
    for s, e, tid, name in nvtx:
        if name.startswith("nsys_arm:"):
            pid = tid & ~0xFFFFFF
            rows = [(a, b, key if key in launches else None) for a, b, key in acts[pid]]
            out[(s, name.split(":", 1)[1])] = _helper_idle(
                (s, e), rows, dict(launches), helper_time
            )
    return out


# ------------------------------------------------------------------------ Kineto, plain JSON


def _ns(value: object) -> int:
    return int(Decimal(str(value)) * 1000)


def _kineto_raw(path: Path) -> dict[tuple[int, str], int]:
    """(window start ns, arm) -> host-bound idle of the helper, over the arm's GPU window: its
    GPU annotation (merged over streams by External id) extended to the last GPU activity
    launched inside the arm's CPU range on any thread, up to the next window's start."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    launches: dict[int, tuple[int, int, int]] = {}
    acts: list[tuple[int, int, int | None]] = []
    helper: dict[int, list[Interval]] = defaultdict(list)
    syncs: dict[int, list[Interval]] = defaultdict(list)
    annotations: dict[tuple[str, int], list[int]] = {}
    cpu_ranges: dict[str, list[Interval]] = defaultdict(list)
    sync_ops = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero"}
    launch_api = ("cudaLaunch", "cuLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch")
    copies = []
    for ev in events:
        cat, name = ev.get("cat"), ev.get("name", "")
        if ev.get("ph") != "X":
            continue
        start = _ns(ev["ts"])
        end = start + _ns(ev.get("dur", 0))
        args = ev.get("args") or {}
        if cat in ("cuda_runtime", "cuda_driver") and name.startswith(launch_api):
            if "correlation" in args and "HostFunc" not in name:
                launches.setdefault(args["correlation"], (start, end, ev["tid"]))
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            acts.append((start, end, args.get("correlation")))
            if cat == "gpu_memcpy" and ("DtoH" in name or "Device -> Host" in name):
                copies.append((args.get("correlation"), end))
        elif cat == "python_function" and name.endswith(f": {HELPER}"):
            helper[ev["tid"]].append((start, end))
        elif cat == "cpu_op" and name in sync_ops:
            syncs[ev["tid"]].append((start, end))
        elif cat == "user_annotation" and name.startswith("arm:"):
            cpu_ranges[name].append((start, end))
        elif cat == "gpu_user_annotation" and name.startswith("arm:"):
            key = (name, args.get("External id", -1))
            lo, hi = annotations.get(key, [start, end])
            annotations[key] = [min(lo, start), max(hi, end)]
    for corr, end in copies:
        if corr in launches:
            ls, le, tid = launches[corr]
            syncs[tid].append((ls, max(le, end)))
    acts = [(s, e, k if k in launches else None) for s, e, k in acts]
    helper_time = {t: _minus(_disjoint(v), _disjoint(syncs.get(t, []))) for t, v in helper.items()}
    per_name: dict[str, list[Interval]] = defaultdict(list)
    for (name, _), (lo, hi) in annotations.items():
        per_name[name].append((lo, hi))
    out = {}
    for name, intervals in per_name.items():
        intervals.sort()
        cpu = sorted(cpu_ranges[name])
        assert len(cpu) == len(intervals)
        for k, ((lo, hi), (cs, ce)) in enumerate(zip(intervals, cpu, strict=True)):
            ends = [e for _, e, c in acts if c is not None and cs <= launches[c][0] <= ce]
            nxt = intervals[k + 1][0] if k + 1 < len(intervals) else None
            if ends:
                hi = max(hi, min(max(ends), nxt) if nxt is not None else max(ends))
            out[(lo, name.split(":", 1)[1])] = _helper_idle((lo, hi), acts, launches, helper_time)
    return out


# ------------------------------------------------------------------------ the tests


def _account_helper_idle(an: Analysis, prefix: str) -> dict[tuple[int, str], int]:
    out = {}
    for s in an.report.step_accounts:
        if s.window.startswith(prefix):
            out[(s.start_ns, s.window.split(":", 1)[1])] = sum(
                p.time_ns for p in s.parts if p.part == K.IDLE_HOST and p.label == HELPER
            )
    return out


def _check_exact(an: Analysis) -> None:
    report = an.report
    timelines = {(t.rank, t.window, t.name, t.index): t for t in report.window_timelines}
    assert len(report.step_accounts) == len(report.windows)
    for step in report.step_accounts:
        by = defaultdict(int)
        for p in step.parts:
            by[p.part] += p.time_ns
        assert sum(by.values()) == step.span_ns == step.end_ns - step.start_ns
        t = timelines[(step.rank, step.window, step.name, step.index)]
        assert (step.start_ns, step.end_ns) == (t.start_ns, t.end_ns)
        assert by[K.COMPUTE] == t.computation_ns
        assert by[K.EXPOSED_COMMUNICATION] + by[K.IDLE_PEER] == t.exposed_communication_ns
        assert by[K.EXPOSED_MEMCPY] == t.exposed_memcpy_ns
        assert by[K.IDLE_HOST] + by[K.IDLE_SYNC] + by[K.IDLE_OTHER] == t.idle_ns
    for group in report.accounts:
        assert sum(p.time_ns for p in group.parts) == group.span_ns
        key = (group.rank, group.window)
        steps = [s for s in report.step_accounts if (s.rank, s.window) == key]
        assert group.span_ns == sum(s.span_ns for s in steps) and group.windows == len(steps)


def test_nsys_parts_add_up_exactly_for_every_rank_and_window(nsys_3arms: Analysis) -> None:
    _check_exact(nsys_3arms)


def test_kineto_parts_add_up_exactly_for_every_rank_and_window(kineto_3arms: Analysis) -> None:
    _check_exact(kineto_3arms)


@pytest.mark.parametrize("fixture", ["nsys_3arms", "kineto_3arms"])
def test_evidence_keeps_the_longest_piece_per_step_and_three_per_group(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """A step line of a group with several windows per rank keeps its step's longest piece, a
    group line the three longest over its steps (docs/analyzers.md, evidence per part); the
    longest piece of a group line is the longest of its steps' longest pieces."""
    report = request.getfixturevalue(fixture).report
    steps: dict[tuple[object, ...], list[int]] = defaultdict(list)
    windows: dict[tuple[int, str], int] = defaultdict(int)
    for step in report.step_accounts:
        windows[(step.rank, step.window)] += 1
    multi = 0
    for step in report.step_accounts:
        several = windows[(step.rank, step.window)] > 1
        for p in step.parts:
            assert 1 <= len(p.largest) <= (1 if several else 3)
            assert all(g.window == step.name and g.index == step.index for g in p.largest)
            steps[(step.rank, step.window, p.part, p.label, p.detail)].append(
                p.largest[0].duration_ns
            )
            multi += several
    # the Kineto arm groups have 3 steps per rank; the nsys export one window per arm and rank
    assert (multi > 0) == (fixture == "kineto_3arms")
    for group in report.accounts:
        for p in group.parts:
            durations = [g.duration_ns for g in p.largest]
            assert 1 <= len(durations) <= 3 and durations == sorted(durations, reverse=True)
            key = (group.rank, group.window, p.part, p.label, p.detail)
            assert durations[0] == max(steps[key])


@pytest.mark.parametrize("fixture", ["nsys_3arms", "kineto_3arms"])
def test_padded_arm_helper_idle_exceeds_the_fast_arms(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    an: Analysis = request.getfixturevalue(fixture)
    prefix = "nsys_arm:" if fixture == "nsys_3arms" else "arm:"
    per_arm: dict[str, int] = defaultdict(int)
    for (_, arm), ns in _account_helper_idle(an, prefix).items():
        per_arm[arm] += ns
    assert per_arm["auto_clone"] > 0
    assert per_arm["auto_clone"] > per_arm["explicit_false"]
    assert per_arm["auto_clone"] > per_arm["auto_same"]


def test_nsys_helper_idle_equals_the_raw_rows(nsys_3arms: Analysis) -> None:
    raw = _nsys_raw(NSYS_3ARMS)
    assert raw == _account_helper_idle(nsys_3arms, "nsys_arm:")
    assert sum(v for (_, arm), v in raw.items() if arm == "auto_clone") > 0


def test_kineto_helper_idle_equals_the_raw_json(kineto_3arms: Analysis) -> None:
    raw: dict[tuple[int, str], int] = {}
    for path in KINETO_3ARMS:
        raw.update(_kineto_raw(path))
    assert raw == _account_helper_idle(kineto_3arms, "arm:")
    assert sum(v for (_, arm), v in raw.items() if arm == "auto_clone") > 0


def test_padded_path_finding_states_the_idle_time(nsys_3arms: Analysis) -> None:
    (finding,) = [f for f in nsys_3arms.report.findings if f.rule == "padded-path-without-padding"]
    idle = [e for e in finding.evidence if e.name.startswith("GPU idle per step because of")]
    assert sorted(e.rank for e in idle) == [0, 1]
    groups = {
        g.rank: g for g in nsys_3arms.report.accounts if g.window == "nsys_arm:auto_clone"
    }
    for e in idle:
        g = groups[e.rank]
        ns = sum(p.time_ns for p in g.parts if p.part == K.IDLE_HOST and p.label == HELPER)
        assert e.value == round(ns / g.steps / 1e6, 4) and e.unit == "ms"
    worst = max(float(e.value) for e in idle if e.value is not None)  # type: ignore[arg-type]
    assert f"idle {worst:.2f} ms per step because of {HELPER} on the host" in finding.title


def test_cli_prints_the_account_and_its_json_is_complete(tmp_path: Path) -> None:
    import json as json_

    from typer.testing import CliRunner

    from cptrace.cli import app

    args = ["analyze", str(NSYS_3ARMS), "--step-pattern", "^nsys_arm:"]
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "nsys_arm:auto_clone: where the step went" in text.output
    assert "nsys_arm:auto_clone: top idle causes" in text.output
    raw = CliRunner().invoke(app, [*args, "--json"])
    report = json_.loads(raw.output)
    assert len(report["step_accounts"]) == len(report["windows"])
    for step in report["step_accounts"]:
        assert sum(p["time_ns"] for p in step["parts"]) == step["span_ns"]
    saved = tmp_path / "report.json"
    saved.write_text(raw.output, encoding="utf-8")
    compare_args = [
        "compare",
        "--base",
        str(saved),
        "--base-window",
        "nsys_arm:auto_clone",
        "--head-window",
        "nsys_arm:explicit_false",
    ]
    compare = CliRunner().invoke(app, [*compare_args, "--json"])
    assert compare.exit_code == 0, compare.output
    lines = {(d["part"], d["label"]): d for d in json_.loads(compare.output)["account"]}
    helper = lines[("idle: host-bound", HELPER)]
    assert helper["head_ns"] == 0 and helper["delta_ns"] == -helper["base_ns"] < 0
    shown = CliRunner().invoke(app, compare_args)
    assert "where the step went: nsys_arm:auto_clone -> nsys_arm:explicit_false" in shown.output
