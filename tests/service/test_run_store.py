"""``service.storage.runs`` on both backends (the ``queue_store`` fixture: a SQLite file and a
real PostgreSQL database): the run list's filters, sorts and LIKE escaping, reports, page
summaries, comparisons, metric history, delete and blob reclaim, and the stored-bytes quota
checked inside the upload's own transaction."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
from queue_store import QueueStore

from service.core.errors import NotFound, PayloadTooLarge
from service.storage import runs, tokens
from service.storage.engine import Conn
from service.storage.runs import Metric, RunFilters


def _run(conn: Conn, name: str, **kw: Any) -> int:
    manifest = kw.pop("manifest", None)
    status = kw.pop("status", "analysed")
    return runs.create_run(conn, name=name, source="test", status=status, manifest=manifest, **kw)


def _names(conn: Conn, **kw: Any) -> list[str]:
    filters = RunFilters(**kw.pop("filters", {}))
    found = runs.list_runs(conn, filters=filters, limit=kw.pop("limit", 50), offset=0, **kw)
    return [r["name"] for r in found]


def _report(conn: Conn, run_id: int, findings: float, median: float | None = None) -> None:
    metrics = [(Metric.FINDINGS, "", findings), (Metric.GPU_BUSY_MS_PER_STEP, "b", 1.0)]
    metrics += [(Metric.GPU_BUSY_MS_PER_STEP, "a", 2.0)]
    if median is not None:
        metrics.append((Metric.ITERATION_MEDIAN_MS, "", median))
    runs.record_report(
        conn, run_id=run_id, schema_version=3, catalog_version="c", report_json='{"r": "é"}',
        duration_s=1.5, metrics=metrics,
    )  # fmt: skip


def test_run_list_filters_sorts_and_escapes_like(queue_store: QueueStore) -> None:
    db = queue_store.open()

    def fill(conn: Conn) -> None:
        a = _run(conn, "Alpha 100%", branch="main", commit="ab_12", config_key="k1")
        b = _run(conn, "alpha_x", branch="dev", commit="abx12", config_key="k1")
        c = _run(conn, "Beta", branch="main", commit="cd", config_key="k2", status="failed")
        _run(conn, "zeta", status="queued", manifest={"run": {"repo": "o/r", "pr": 7}})
        _run(conn, "ärger", branch="main", manifest={"workload": {"implementation": "te"}})
        _report(conn, a, findings=2, median=5.0)
        _report(conn, b, findings=0, median=3.0)
        _report(conn, c, findings=0)

    db.write_tx(fill)

    def check(conn: Conn) -> None:
        assert _names(conn) == ["ärger", "zeta", "Beta", "alpha_x", "Alpha 100%"]
        # a substring, case-folded; % and _ are themselves, not wildcards
        assert _names(conn, filters={"name": "ALPHA"}) == ["alpha_x", "Alpha 100%"]
        assert _names(conn, filters={"name": "0%"}) == ["Alpha 100%"]
        assert _names(conn, filters={"name": "a_"}) == ["alpha_x"]
        assert _names(conn, filters={"commit": "ab_"}) == ["Alpha 100%"]
        assert _names(conn, filters={"branch": "main", "verdict": "clean"}) == []
        assert _names(conn, filters={"verdict": "failed"}) == ["Beta"]
        assert _names(conn, filters={"verdict": "findings"}) == ["Alpha 100%"]
        assert _names(conn, filters={"verdict": "pending"}) == ["zeta"]
        assert _names(conn, filters={"repo": "o/r", "pr": 7}) == ["zeta"]
        assert _names(conn, filters={"implementation": "te"}) == ["ärger"]
        assert _names(conn, filters={"date_from": "2000-01-01", "date_to": "2999-12-31"}) == [
            "ärger", "zeta", "Beta", "alpha_x", "Alpha 100%",
        ]  # fmt: skip
        assert _names(conn, filters={"date_to": "2000-01-01"}) == []
        # text sorts by bytes on both backends (upper case first, non-ASCII last)
        assert _names(conn, sort="name", order="asc") == [
            "Alpha 100%", "Beta", "alpha_x", "zeta", "ärger",
        ]  # fmt: skip
        # runs without the value last, whichever the direction
        assert _names(conn, sort="median_ms", order="asc")[:2] == ["alpha_x", "Alpha 100%"]
        assert _names(conn, sort="median_ms", order="desc")[:2] == ["Alpha 100%", "alpha_x"]
        assert _names(conn, sort="branch", order="desc") == [
            "ärger", "Beta", "Alpha 100%", "alpha_x", "zeta",
        ]  # fmt: skip
        assert _names(conn, sort="verdict", order="asc") == [
            "alpha_x", "Beta", "Alpha 100%", "zeta", "ärger",
        ]  # fmt: skip
        assert _names(conn, limit=2) == ["ärger", "zeta"]
        far = runs.list_runs(conn, filters=RunFilters(), limit=2**63, offset=2**63)
        assert far == []
        assert runs.count_runs(conn, filters=RunFilters()) == 5
        assert runs.count_runs(conn, filters=RunFilters(verdict="clean")) == 1
        assert runs.count_runs(conn, filters=RunFilters(name="alpha")) == 2
        row = runs.list_runs(conn, filters=RunFilters(name="100%"), limit=1, offset=0)[0]
        assert (row["findings"], row["median_ms"], row["verdict"], row["traces"]) == (
            2, 5.0, "findings", 0,
        )  # fmt: skip
        assert row["commit"] == "ab_12"
        options = runs.distinct_values(conn)
        assert options["branch"] == ["dev", "main"]
        assert options["status"] == ["analysed", "failed", "queued"]
        with pytest.raises(ValueError, match="sort must be one of"):
            runs.list_runs(conn, filters=RunFilters(), limit=1, offset=0, sort="manifest_json")

    db.read(check)


def _page(db: Any, run_id: int) -> tuple[int, str]:
    stored = db.read(lambda c: runs.page_json(c, run_id=run_id))
    assert stored is not None
    return stored[0], stored[2]


def test_reports_pages_comparisons_and_history(queue_store: QueueStore) -> None:
    db = queue_store.open()
    ids = db.write_tx(lambda c: [_run(c, n, config_key="k") for n in ("base", "head")])
    base, head = ids
    db.write_tx(lambda c: _report(c, base, findings=1, median=4.0))
    db.write_tx(lambda c: _report(c, base, findings=0, median=6.0))  # replaces the first

    def page(conn: Conn, version: int, text: str, **kw: Any) -> None:
        runs.store_page(conn, run_id=base, version=version, page_json=text, **kw)

    db.write_tx(lambda c: page(c, 2, "first"))
    first = db.read(lambda c: runs.page_stamp(c, run_id=base))
    db.write_tx(lambda c: page(c, 2, "stale build", if_stale=True))  # same version: kept
    db.write_tx(lambda c: page(c, 2, "again", if_stale=True, unreadable="never"))
    assert _page(db, base) == (2, "first")
    db.write_tx(lambda c: page(c, 2, "repaired", if_stale=True, unreadable="first"))
    assert _page(db, base) == (2, "repaired")
    db.write_tx(lambda c: page(c, 1, "older", if_stale=False))
    stored = db.read(lambda c: runs.page_json(c, run_id=base))
    assert stored is not None and stored[::2] == (1, "older") and first is not None
    assert stored[1] != first[1]
    # no page for a run without a report when the build is a view's (if_stale)
    db.write_tx(lambda c: runs.store_page(c, run_id=head, version=1, page_json="x", if_stale=True))
    assert db.read(lambda c: runs.page_stamp(c, run_id=head)) is None

    def compare(conn: Conn, verdict: str) -> None:
        runs.store_comparison(
            conn, base_run_id=base, head_run_id=head, base_window=None, head_window="w",
            verdict=verdict, summary="s", report_json="{}",
        )  # fmt: skip

    db.write_tx(lambda c: compare(c, "same"))
    db.write_tx(lambda c: compare(c, "ignored"))  # an identical one is stored once

    def check(conn: Conn) -> None:
        out = io.BytesIO()
        assert runs.copy_report(conn, run_id=base, into=out) == len('{"r": "é"}'.encode())
        assert out.getvalue().decode() == '{"r": "é"}'
        assert runs.copy_report(conn, run_id=head, into=io.BytesIO()) is None
        assert runs.report_json(conn, run_id=head) is None
        assert runs.window_groups(conn, run_id=base) == ["a", "b"]
        facts = runs.analysis_facts(conn, run_id=base)
        assert (facts["has_report"], facts["duration_s"], facts["task"]) == (True, 1.5, None)
        found = runs.find_comparison(
            conn, base_run_id=base, head_run_id=head, base_window="", head_window="w"
        )
        assert found is not None and found["verdict"] == "same"
        listed = runs.list_comparisons(conn, run_id=head, limit=10, offset=0)
        assert [c["id"] for c in listed] == [found["id"]] and "report_json" not in listed[0]
        again = runs.comparison_by_id(conn, comparison_id=found["id"])
        assert again is not None and again["summary"] == "s"
        history = runs.metric_history(
            conn, config_key="k", metric=Metric.ITERATION_MEDIAN_MS.value, label="", limit=10
        )
        assert [(h["run_id"], h["value"], h["failed"]) for h in history] == [(base, 6.0, 0)]
        assert runs.runs_with_reports_older_than(conn, schema_version=4) == [base]
        assert runs.runs_with_reports_older_than(conn, schema_version=3) == []

    db.read(check)
    db.write_tx(lambda c: _report(c, base, findings=0))  # a new report: its comparisons go
    assert db.read(lambda c: runs.list_comparisons(c, run_id=base, limit=10, offset=0)) == []


def test_delete_run_reclaims_only_unshared_blobs(queue_store: QueueStore) -> None:
    db = queue_store.open()

    def fill(conn: Conn) -> tuple[int, int]:
        one, two = _run(conn, "one"), _run(conn, "two")
        for run_id, digest in ((one, "shared"), (one, "own"), (two, "shared")):
            runs.add_run_file(
                conn, run_id=run_id, role="trace", name=digest, sha256=digest, size=10, rank=0
            )
        runs.record_upload(conn, key="k1", run_id=one)
        return one, two

    one, two = db.write_tx(fill)
    assert db.read(lambda c: runs.has_traces(c, run_id=one))
    assert [f["name"] for f in db.read(lambda c: runs.trace_files(c, run_id=one))] == [
        "shared", "own",
    ]  # fmt: skip
    assert db.write_tx(lambda c: runs.delete_run(c, run_id=one)) == ["own"]
    with pytest.raises(NotFound):
        db.write_tx(lambda c: runs.delete_run(c, run_id=one))

    def check(conn: Conn) -> None:
        assert not runs.run_exists(conn, run_id=one) and runs.run_exists(conn, run_id=two)
        assert runs.find_upload(conn, key="k1") is None
        assert runs.blob_recorded(conn, digest="shared")
        assert not runs.blob_recorded(conn, digest="own")
        assert runs.total_runs(conn) == 1

    db.read(check)


def test_quota_is_checked_inside_the_upload_transaction(queue_store: QueueStore) -> None:
    """Two uploads of one token, each under its quota alone, run at once on two handles (two
    processes): the second sums after the first committed, so only one is stored."""
    first, second = queue_store.open(), queue_store.open()
    token = first.write(
        lambda c: tokens.insert_token(
            c, name="t", role="uploader", token_hash="h", created_at="x", runner=None, repo=None
        )
    )
    inside = threading.Event()
    outcomes: dict[str, str] = {}

    def upload(db: Any, key: str, hold: bool) -> None:
        def tx(conn: Conn) -> None:
            run_id = _run(conn, key, status="queued")
            runs.add_run_file(conn, run_id=run_id, role="trace", name=key, sha256=key, size=60)
            runs.record_upload(conn, key=key, run_id=run_id, token_id=token, quota=100)
            if hold:
                inside.set()
                time.sleep(0.5)  # the other upload starts while this one is uncommitted

        try:
            db.write_tx(tx)
            outcomes[key] = "stored"
        except PayloadTooLarge:
            outcomes[key] = "refused"

    holder = threading.Thread(target=upload, args=(first, "a", True))
    holder.start()
    assert inside.wait(10)
    upload(second, "b", False)
    holder.join(10)
    assert outcomes == {"a": "stored", "b": "refused"}
    assert first.read(lambda c: runs.stored_bytes_of_token(c, token_id=token)) == 60
    assert first.read(lambda c: runs.find_upload(c, key="b")) is None
    assert not first.read(lambda c: runs.blob_recorded(c, digest="b"))
