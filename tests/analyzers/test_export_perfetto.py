"""``cptrace export perfetto``: valid Chrome trace-event JSON of one window, read back by cptrace.

The Perfetto UI cannot be fetched here, so the checks are the format's own rules (every event a
``ph``; complete slices with numeric ``ts``/``dur`` and integer ``pid``/``tid``; named tracks),
every slice inside its rank's window, one track per rank and stream plus the idle track, the
idle track adding up to the account's idle time, and cptrace's Kineto reader reading the file
back with exactly the activities the window holds (clipped to it).
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from analyzers.catalog import load_catalog
from analyzers.export.perfetto import IDLE_CATEGORY, IDLE_TID, ExportError, perfetto_trace
from analyzers.pipeline import Analysis
from analyzers.readers.kineto import read_kineto
from analyzers.report import AccountPartKind as K
from cptrace.cli import app
from tests.analyzers.conftest import KINETO_3ARMS

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

CATS = {0: "kernel", 1: "gpu_memcpy", 2: "gpu_memset"}
META = {"process_name", "thread_name", "process_sort_index"}


def _export(an: Analysis, window: str) -> dict[str, Any]:
    doc = perfetto_trace(
        an.trace, an.attribution, an.ranges, load_catalog(), an.report.windows, window
    )
    return json.loads(json.dumps(doc))  # what a reader of the file sees


def _ns(us: float) -> int:
    return int(Decimal(str(us)) * 1000)


def _check_format(doc: dict[str, Any]) -> None:
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "M":
            assert e["name"] in META and isinstance(e["args"], dict)
            continue
        assert isinstance(e["tid"], int) and isinstance(e["cat"], str)
        assert isinstance(e["ts"], int | float) and isinstance(e["dur"], int | float)
        assert e["dur"] >= 0 and isinstance(e["args"], dict)


def _windows(doc: dict[str, Any]) -> dict[int, tuple[int, int]]:
    return {
        w["rank"]: (_ns(w["start_us"]), _ns(w["end_us"]))
        for w in doc["otherData"]["cptrace"]["windows"]
    }


def _expected_activities(
    an: Analysis, doc: dict[str, Any]
) -> Counter[tuple[str, str, int, int, int, int]]:
    """The trace's activities of each rank overlapping its window, clipped, relative to the
    export's origin; straight from the trace table."""
    origin = doc["otherData"]["cptrace"]["origin_ns"]
    acts = an.trace.activities
    out: Counter[tuple[str, str, int, int, int, int]] = Counter()
    for rank, (lo, hi) in _windows(doc).items():
        lo, hi = lo + origin, hi + origin
        for row in acts[(acts["rank"] == rank) & (acts["start"] < hi) & (acts["end"] > lo)]:
            start, end = max(int(row["start"]), lo), min(int(row["end"]), hi)
            if end > start:
                out[
                    (
                        CATS[int(row["kind"])],
                        an.trace.strings[int(row["name"])],
                        int(row["device"]),
                        int(row["stream"]),
                        start - origin,
                        end - origin,
                    )
                ] += 1
    return out


@pytest.mark.parametrize(
    ("fixture", "window"),
    [("kineto_3arms", "arm:auto_clone#1"), ("nsys_3arms", "nsys_arm:explicit_false")],
)
def test_export_is_valid_and_every_slice_lies_in_its_window(
    fixture: str, window: str, request: pytest.FixtureRequest
) -> None:
    an: Analysis = request.getfixturevalue(fixture)
    doc = _export(an, window)
    _check_format(doc)
    windows = _windows(doc)
    assert sorted(windows) == [0, 1]
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            lo, hi = windows[e["args"]["rank"]]
            assert lo <= _ns(e["ts"]) and _ns(e["ts"]) + _ns(e["dur"]) <= hi, e
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    for rank in (0, 1):
        gpu = 2 * rank + 1
        assert names[(gpu, None)] == f"rank {rank} GPU"
        assert names[(2 * rank + 2, None)] == f"rank {rank} CPU"
        assert names[(gpu, IDLE_TID)] == "idle gaps (cptrace account)"
        streams = {e["tid"] for e in doc["traceEvents"]
                   if e["ph"] == "X" and e["pid"] == gpu and e["cat"] in CATS.values()}
        assert streams and all(names[(gpu, s)] == f"stream {s}" for s in streams)
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    assert {"helper", "category", "account part", "account"} <= set(kernel["args"])


@pytest.mark.parametrize(
    ("fixture", "window"),
    [("kineto_3arms", "arm:auto_clone#1"), ("nsys_3arms", "nsys_arm:auto_clone")],
)
def test_idle_track_is_the_accounts_idle_time(
    fixture: str, window: str, request: pytest.FixtureRequest
) -> None:
    an: Analysis = request.getfixturevalue(fixture)
    doc = _export(an, window)
    group, _, index = window.partition("#")
    for rank in (0, 1):
        (step,) = [s for s in an.report.step_accounts
                   if (s.rank, s.window, s.index) == (rank, group, int(index or 0))]
        idle = {K.IDLE_HOST, K.IDLE_SYNC, K.IDLE_OTHER}
        expected = Counter()
        for p in step.parts:
            if p.part in idle:
                expected[f"{p.part.value}: {p.label}"] += p.time_ns
        drawn = Counter()
        for e in doc["traceEvents"]:
            if e.get("cat") == IDLE_CATEGORY and e["args"]["rank"] == rank:
                drawn[e["name"]] += _ns(e["dur"])
        assert drawn == expected


def test_kineto_reader_reads_the_export_back_with_the_same_activities(
    kineto_3arms: Analysis, nsys_3arms: Analysis, tmp_path: Path
) -> None:
    for an, window in ((kineto_3arms, "arm:explicit_false#2"), (nsys_3arms, "nsys_arm:auto_same")):
        doc = _export(an, window)
        path = tmp_path / "step.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
        back = read_kineto(path, rank=0)
        got: Counter[tuple[str, str, int, int, int, int]] = Counter(
            (
                CATS[int(r["kind"])],
                back.strings[int(r["name"])],
                int(r["device"]),
                int(r["stream"]),
                int(r["start"]),
                int(r["end"]),
            )
            for r in back.activities
        )
        expected = _expected_activities(an, doc)
        assert got == expected and sum(got.values()) > 100
        # the launch calls come back too, joined to their activities by correlation
        assert len(back.launches) > 0


def test_cli_writes_the_file_and_names_missing_windows(tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    args = ["export", "perfetto", *map(str, KINETO_3ARMS), "--step-pattern", "^arm:"]
    result = CliRunner().invoke(app, [*args, "--window", "arm:auto_same", "-o", str(out)])
    assert result.exit_code == 0, result.output
    _check_format(json.loads(out.read_text(encoding="utf-8")))
    result = CliRunner().invoke(app, [*args, "--window", "arm:nope", "-o", str(out)])
    assert result.exit_code == 1 and "Error: no window 'arm:nope'" in result.output
    assert "arm:auto_clone" in result.output


def test_unknown_window_is_an_export_error(nsys_3arms: Analysis) -> None:
    with pytest.raises(ExportError, match=r"window groups: .*nsys_arm:auto_clone"):
        _export(nsys_3arms, "ProfilerStep#9")


def test_two_rank_export_reads_back_as_two_ranks_with_memcpy_bytes(
    nsys_3arms: Analysis, tmp_path: Path
) -> None:
    """Issue 25, defect 7: one file holding both ranks was read back as one rank, its memcpy
    rows without the bytes they moved."""
    from analyzers.attribution import link_launches
    from analyzers.pipeline import analyze

    doc = _export(nsys_3arms, "nsys_arm:auto_same")
    path = tmp_path / "step.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    back = read_kineto(path)
    assert back.rank_list() == [0, 1]
    origin = doc["otherData"]["cptrace"]["origin_ns"]
    acts = nsys_3arms.trace.activities
    want: Counter[tuple[int, str, int, int]] = Counter()
    for rank, (lo, hi) in _windows(doc).items():
        rows = acts[(acts["rank"] == rank) & (acts["start"] >= lo + origin)]
        for r in rows[(rows["end"] <= hi + origin) & (rows["kind"] == 1)]:
            want[(rank, nsys_3arms.trace.strings[int(r["name"])], int(r["bytes"]),
                  int(r["start"]) - origin)] += 1
    got = Counter(
        (int(r["rank"]), back.strings[int(r["name"])], int(r["bytes"]), int(r["start"]))
        for r in back.activities[back.activities["kind"] == 1]
    )
    assert got == want and sum(got.values()) > 0 and all(b > 0 for _, _, b, _ in got)
    # every activity finds its own rank's launch again (correlation ids of the ranks collide)
    launch = link_launches(back)
    joined = launch >= 0
    assert joined.sum() > 100
    assert (back.launches["rank"][launch[joined]] == back.activities["rank"][joined]).all()
    assert analyze(path).ranks == [0, 1]
