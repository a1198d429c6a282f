"""Many distinct kernel names cannot buy a huge report (issue 24, item 6: 5,000 distinct 4 KB
names in a 134 KB upload made a 92 MB report and a 100 MB JSON twin). Each kernel table lists
at most ``MAX_KERNEL_ROWS`` names plus one exact "other" row, so its rows still add up; the
timeline spells out distinct names only within a budget. Real analysis of a real (synthetic)
Kineto trace, then the same upload through the real app, worker and pages."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict

import pytest
from fastapi.testclient import TestClient
from service_factories import KINETO_RANK0, auth, bundle_with, drain_worker

from analyzers.kernels import MAX_KERNEL_ROWS, OTHER_KERNELS
from analyzers.metrics import TIMELINE_LONG_NAME, TIMELINE_NAME_BUDGET, TIMELINE_SHORT_NAME
from analyzers.report import AnalysisReport
from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings

pytestmark = pytest.mark.slow  # an analysis / many generated requests: scheduled first

NAMES = 300  # distinct names, each 4 KB: 1.2 MB of names in a small gzipped trace
NAME_CHARS = 4096
MiB = 1024 * 1024


def _many_names_trace() -> tuple[bytes, dict[str, list[int]]]:
    """The synthetic rank-0 trace with its kernels replaced by ``NAMES`` distinct long-named
    ones (durations vary per name); also each name's durations in ns."""
    trace = json.loads(gzip.decompress(KINETO_RANK0.read_bytes()))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    events = [e for e in trace["traceEvents"] if e.get("cat") != "kernel"]
    durations: dict[str, list[int]] = defaultdict(list)
    for i in range(NAMES * 2):  # two instances of each name
        k = dict(kernels[i % len(kernels)])
        k["name"] = f"{i % NAMES:05d}" + "k" * (NAME_CHARS - 5)
        k["args"] = {**k.get("args", {}), "correlation": 10**7 + i}
        k["dur"] = 1 + (i % NAMES) % 97 + i // NAMES  # microseconds
        durations[k["name"]].append(int(k["dur"] * 1000))
        events.append(k)
    trace["traceEvents"] = events
    return gzip.compress(json.dumps(trace).encode()), durations


@pytest.fixture(scope="module")
def many_names() -> tuple[bytes, dict[str, list[int]]]:
    return _many_names_trace()


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, many_names: tuple[bytes, dict[str, list[int]]]
) -> tuple[AnalysisReport, dict[str, int]]:
    """The trace uploaded in a bundle, analysed by the worker; the report as the API answers
    it, and the sizes of the report and of the run page's JSON twin."""
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("names"), ingest_workers=0))
    admin = auth(app.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN)))
    body = bundle_with("traces/r0.json.gz", many_names[0], "kineto")
    with TestClient(app) as client:
        made = client.post(
            "/api/v1/uploads/bundles", content=body,
            headers={**admin, "Content-Type": "application/gzip"},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        run_id = made.json()["run_id"]
        drain_worker(app.state.settings)
        assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "analysed"
        answers = {
            "report": client.get(f"/api/v1/runs/{run_id}/analysis/result"),
            "twin": client.get(f"/runs/{run_id}.json"),
        }
    assert all(a.status_code == 200 for a in answers.values())
    report = AnalysisReport.model_validate_json(answers["report"].content)
    return report, {what: len(a.content) for what, a in answers.items()}


@pytest.fixture(scope="module")
def report(served: tuple[AnalysisReport, dict[str, int]]) -> AnalysisReport:
    return served[0]


def test_each_kernel_table_lists_at_most_the_cap_and_adds_up(
    report: AnalysisReport, many_names: tuple[bytes, dict[str, list[int]]]
) -> None:
    _, durations = many_names
    tables: dict[tuple[str, int | None], list] = defaultdict(list)
    for k in report.kernels:
        tables[(k.window, k.rank)].append(k)
    assert tables
    for key, rows in tables.items():
        assert len(rows) <= MAX_KERNEL_ROWS + 1, key
        names = [r.name for r in rows]
        assert len(names) == len(set(names)), f"{key}: a name listed twice"
        assert sum(r.time_pct for r in rows) == pytest.approx(100.0)
    whole = tables[("whole trace", None)]
    (other,) = [r for r in whole if r.name == OTHER_KERNELS]
    assert whole[-1] is other  # the named rows first, by time
    named = [r for r in whole if r.name != OTHER_KERNELS]
    assert len(named) == MAX_KERNEL_ROWS and other.names == NAMES - MAX_KERNEL_ROWS
    listed = {r.name for r in named}
    assert min(r.total_ns for r in named) >= max(
        sum(durations[n]) for n in durations if n not in listed
    ), "the listed names are those with the most time"
    # the other row's figures are exactly those of all the folded instances together
    folded = sorted(d for n, ds in durations.items() if n not in listed for d in ds)
    assert (other.count, other.total_ns, other.min_ns, other.max_ns) == (
        len(folded), sum(folded), folded[0], folded[-1],
    )  # fmt: skip
    assert other.median_ns == pytest.approx(statistics.median(folded), rel=1e-12)
    assert other.stddev_ns == pytest.approx(statistics.stdev(folded), rel=1e-9)
    all_instances = [d for ds in durations.values() for d in ds]
    assert sum(r.count for r in whole) == len(all_instances)
    assert sum(r.total_ns for r in whole) == sum(all_instances)


def test_the_timeline_spells_out_names_within_its_budget(report: AnalysisReport) -> None:
    timeline = report.timeline
    assert timeline is not None and len(timeline.events) > NAMES
    distinct = {e.name for e in timeline.events}
    full = [n for n in distinct if len(n) > TIMELINE_SHORT_NAME]
    assert sum(len(n) for n in full) <= TIMELINE_NAME_BUDGET
    assert all(len(e.name) <= TIMELINE_LONG_NAME for e in timeline.events)
    assert any("...[truncated: 4096 chars]" in n for n in distinct)


def test_report_and_pages_stay_small(served: tuple[AnalysisReport, dict[str, int]]) -> None:
    _, sizes = served
    # 1.2 MB of distinct names went in; before the caps the report held each twice in its
    # kernel tables and up to 2,000 times in its timeline (600 such names: a 10.2 MB report;
    # a real TE trace's report is 2-2.6 MB)
    assert sizes["report"] < 1.5 * MiB, sizes
    assert sizes["twin"] < 2 * MiB, sizes
