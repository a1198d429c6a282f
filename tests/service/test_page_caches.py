"""The run pages' caches are bounded in bytes, not in entries (issue 24, "Measured").

``service.byte_cache.ByteBoundedCache`` on its own, then the parsed page summaries of
``service.store`` over a real SQLite store holding the page summary of a real trace: more runs
viewed in turn than the old count bound (8) stay parsed, and what is held stays in budget.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from testkit import DATA_DIR

from analyzers import analyze
from cptrace.app import create_app
from service import store
from service.byte_cache import ByteBoundedCache
from service.core.config import Settings
from service.page_summary import page_summary
from service.storage import runs

TRACE = DATA_DIR / "openworld" / "kineto_nccl_world1.json.gz"


def test_entries_leave_least_recently_used_first_once_the_bytes_pass_the_budget() -> None:
    cache: ByteBoundedCache[str] = ByteBoundedCache(100)
    for key in "abcd":
        cache.put(key, key * 2, 30)
    assert len(cache) == 3 and cache.charged_bytes == 90  # "a" left: 120 > 100
    assert cache.get("a") is None
    assert cache.get("b") == "bb"  # now the most recently used
    cache.put("e", "ee", 30)
    assert cache.get("c") is None and cache.get("b") == "bb" and cache.get("e") == "ee"
    assert cache.charged_bytes <= 100


def test_many_small_entries_are_kept_and_one_over_the_budget_is_not() -> None:
    cache: ByteBoundedCache[int] = ByteBoundedCache(1000)
    for i in range(100):
        cache.put(i, i, 10)
    assert len(cache) == 100 and all(cache.get(i) == i for i in range(100))
    cache.put("huge", -1, 1001)
    assert cache.get("huge") is None and len(cache) == 100  # nothing evicted for it
    cache.put(0, 0, 500)  # a replaced entry is charged its new size once
    assert cache.charged_bytes <= 1000 and cache.get(0) == 0
    with pytest.raises(ValueError):
        ByteBoundedCache(-1)


def test_more_runs_than_the_old_count_bound_stay_parsed(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, ingest_workers=0)
    db = create_app(settings).state.db
    report = analyze([TRACE])
    text = report.model_dump_json()
    page = page_summary(report).model_dump_json()

    version = page_summary(report).version

    def add_run(conn: sqlite3.Connection, i: int) -> int:
        run_id = runs.create_run(conn, name=f"r{i}", source="bundle", status="done")
        runs.record_report(
            conn, run_id=run_id, schema_version=report.schema_version,
            catalog_version=report.catalog_version, report_json=text, duration_s=1.0,
            metrics=[], page=(version, page),
        )  # fmt: skip
        return run_id

    ids = [db.write_tx(lambda c, i=i: add_run(c, i)) for i in range(20)]
    store._parsed.clear()
    first = {run_id: store.get_page_summary(db, run_id) for run_id in ids}
    again = {run_id: store.get_page_summary(db, run_id) for run_id in ids}
    # the same objects: none of the 20 was parsed again (a count bound of 8 parsed each twice)
    assert all(again[r] is first[r] is not None for r in ids)
    assert store._parsed.charged_bytes <= store.PARSED_PAGE_BYTES
    assert store._parsed.charged_bytes == 20 * store.PARSED_BYTES_PER_STORED_BYTE * len(page)
