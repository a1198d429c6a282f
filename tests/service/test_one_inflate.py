"""A ``.sqlite.gz`` is inflated once from upload to report: the upload check's copy is the blob
the analysis opens (``service.ingest.stored_plain``), and what it expands to counts as stored.

Counted through the real path: ``stage_trace`` / ``stage_bundle`` (what the upload routes run),
``record_run``, then the analysis worker on the stored run; ``testkit.bytes_yielded`` observes
the one inflate generator (``analyzers.readers.inflated``) without replacing it.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import pytest
from service_factories import bundle_with, drain_worker, sqlite_with
from testkit import DATA_DIR
from testkit.calls import bytes_yielded

from analyzers import analyze
from analyzers.readers import inflated
from analyzers.readers._files import BLOCK_BYTES
from service.core.config import Settings
from service.ingest import Limits, StagedRun, record_run, stage_bundle, stage_trace
from service.storage import runs

EXPORT = DATA_DIR / "te-2.20.2-h200-profile" / "traces" / "nsys_rank0_pid1060.sqlite.gz"
"""A real nsys export larger than one inflate block, so the sniff's head is not the file."""


@pytest.fixture(scope="module")
def settings(app_env: dict[str, Any]) -> Settings:
    return app_env["app"].state.settings


def _limits(stored: int | None = None) -> Limits:
    return Limits(64 << 20, 16, stored)


def _record(app_env: dict[str, Any], staged: StagedRun, key: str) -> int:
    return app_env["db"].write_tx(lambda c: record_run(c, staged, key=key, source="trace")[0])


def _full_inflates(totals: list[int], plain: int) -> int:
    """Runs of the inflate that produced the whole file (a sniff reads one block, not all)."""
    return sum(1 for produced in totals if produced == plain)


def test_an_uploaded_export_is_inflated_once_and_stored_plain(
    app_env: dict[str, Any], settings: Settings, tmp_path: Path
) -> None:
    data = EXPORT.read_bytes()
    plain = len(gzip.decompress(data))
    assert plain > BLOCK_BYTES  # else the sniff's one block would be the whole file
    upload = settings.tmp_dir / "upload-one-inflate"
    upload.write_bytes(data)
    with bytes_yielded(inflated) as totals:
        staged = stage_trace(
            upload,
            hashlib.sha256(data).hexdigest(),
            "rank0.sqlite.gz",
            settings.blob_location,
            tmp_path,
            _limits(),
        )
        run_id = _record(app_env, staged, key="one-inflate")
        drain_worker(settings, analyze=analyze)
    assert _full_inflates(totals, plain) == 1, totals
    assert all(produced <= BLOCK_BYTES for produced in totals if produced != plain), totals
    [stored] = staged.files
    assert (stored.format, stored.gzipped, stored.size) == ("nsys", False, plain)
    assert stored.sha256 == hashlib.sha256(gzip.decompress(data)).hexdigest()
    analysis = app_env["client"].get(f"/api/v1/runs/{run_id}/analysis").json()
    assert analysis["status"] == "done", analysis
    assert app_env["db"].read(lambda c: runs.report_json(c, run_id=run_id))
    # what the token's quota counts is what the store holds: the decompressed bytes
    assert app_env["db"].read(lambda c: runs.run_files(c, run_id=run_id))[0]["size"] == plain


def test_a_bundled_export_is_inflated_once_and_stored_plain(
    app_env: dict[str, Any], settings: Settings, tmp_path: Path
) -> None:
    data = EXPORT.read_bytes()
    plain = len(gzip.decompress(data))
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(bundle_with("traces/rank0.sqlite.gz", data, "nsys"))
    with bytes_yielded(inflated) as totals:
        staged = stage_bundle(bundle, settings.blob_location, tmp_path, _limits(64 << 20))
    # the bundle's own gzip is the outer stream; the export's one inflate is the upload's
    assert _full_inflates(totals, plain) == 1, totals
    [trace] = [f for f in staged.files if f.role == "trace"]
    assert (trace.name, trace.format, trace.gzipped, trace.size) == (
        "traces/rank0.sqlite.gz",
        "nsys",
        False,
        plain,
    )
    assert list(tmp_path.glob("part-*")) == []


def test_an_export_that_would_store_more_than_the_upload_may_is_refused(
    app_env: dict[str, Any], settings: Settings, tmp_path: Path
) -> None:
    from analyzers.bundle import OversizedBundleError
    from analyzers.errors import TraceTooLargeError

    data = EXPORT.read_bytes()
    plain = len(gzip.decompress(data))
    upload = settings.tmp_dir / "upload-too-big"
    upload.write_bytes(data)
    with pytest.raises(TraceTooLargeError, match=f"more than the {plain - 1} bytes this upload"):
        stage_trace(
            upload, "0" * 64, "r.sqlite.gz", settings.blob_location, tmp_path, _limits(plain - 1)
        )
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(bundle_with("traces/rank0.sqlite.gz", data, "nsys"))
    with pytest.raises(OversizedBundleError, match="this upload may store"):
        stage_bundle(bundle, settings.blob_location, tmp_path, _limits(plain))  # + manifest
    assert list(tmp_path.glob("part-*")) == []


def test_a_hostile_export_inflated_for_the_check_leaves_nothing(
    app_env: dict[str, Any], settings: Settings, tmp_path: Path
) -> None:
    from analyzers.errors import HostileTraceError

    data = gzip.compress(sqlite_with(tmp_path, trigger=True))
    upload = settings.tmp_dir / "upload-hostile"
    upload.write_bytes(data)
    with pytest.raises(HostileTraceError, match=r"r\.sqlite\.gz"):
        stage_trace(upload, "0" * 64, "r.sqlite.gz", settings.blob_location, tmp_path, _limits())
    assert list(tmp_path.glob("part-*")) == []
