"""A run of several trace files analysed per rank: one limited process per file, then one
merge (``service.rank_exec``), each a queue task of the worker's.

Real spawned processes under the real limits, real traces, a real worker on a real SQLite file
and blob store: the stored report is the one-process analysis' byte for byte, and the part
blobs are gone from the store once it is stored.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_factories import KINETO_RANK0, KINETO_RANK1, drain_worker, kineto_bundle
from testkit.calls import calls_of

from analyzers.manifest import parse_manifest
from analyzers.pipeline import analyze
from analyzers.readers import TraceInput, _files
from service.analysis_exec import AnalysisFailed, run_isolated, validate_report
from service.core.config import MiB
from service.ingest import Limits, stage_bundle
from service.rank_exec import run_merge_stage, run_rank_stage
from service.storage import tasks
from service.storage.blob_rows import recorded_digests
from service.storage.blobs import open_blobs
from service.worker import trace_input


def _inputs(*paths: Path) -> list[TraceInput]:
    return [
        TraceInput(path=p, format="kineto", gzipped=True, rank=i, label=f"traces/rank{i}.json.gz")
        for i, p in enumerate(paths)
    ]


def _run(inputs: list[TraceInput], scratch: Path, **limits: Any) -> Any:
    """Each input's rank stage, then the merge of their parts: what the rank tasks and the
    merge task of a run do, one after the other."""
    options: dict[str, Any] = {"time_limit_s": 300.0, "memory_limit_bytes": 4096 * MiB}
    options.update(limits)
    decompressed = options.pop("max_decompressed_bytes", 4096 * MiB)
    parts = [scratch / f"part{i:04d}.npz" for i in range(len(inputs))]
    for item, part in zip(inputs, parts, strict=True):
        size = run_rank_stage(
            item, files=len(inputs), part=part, max_decompressed_bytes=decompressed, **options
        )
        assert size == part.stat().st_size > 0
    return run_merge_stage(parts, None, **options)


def test_per_rank_processes_give_the_one_process_report(tmp_path: Path) -> None:
    inputs = _inputs(KINETO_RANK0, KINETO_RANK1)
    report = _run(inputs, tmp_path)
    one_process = validate_report(analyze(inputs).model_dump_json())
    assert report.model_dump_json() == one_process.model_dump_json()
    assert report.ranks == [0, 1]


def test_a_bad_rank_file_fails_the_run_for_good_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": '))
    inputs = _inputs(KINETO_RANK0, broken)
    with pytest.raises(AnalysisFailed) as caught:
        _run(inputs, tmp_path)
    assert caught.value.final
    assert "broken.json.gz" in str(caught.value)


def test_each_rank_process_is_under_the_memory_limit(tmp_path: Path) -> None:
    """A limit below what reading one file needs fails the run with the reason, for good."""
    with pytest.raises(AnalysisFailed, match="more memory than its limit of 64 MiB") as caught:
        _run(_inputs(KINETO_RANK0, KINETO_RANK1), tmp_path, memory_limit_bytes=64 * MiB)
    assert caught.value.final


def test_the_callers_decompression_cap_reaches_the_readers(tmp_path: Path) -> None:
    """The service's cap (``Settings.max_decompressed_bytes``) is what the analysis children
    read under, per rank and in one process: not the readers' 64 GiB default."""
    inputs = _inputs(KINETO_RANK0, KINETO_RANK1)
    with pytest.raises(AnalysisFailed, match="1024") as caught:
        _run(inputs, tmp_path, max_decompressed_bytes=1024)
    assert caught.value.final
    with pytest.raises(AnalysisFailed, match="1024") as caught:
        run_isolated(
            inputs, None, time_limit_s=300.0, memory_limit_bytes=4096 * MiB,
            max_decompressed_bytes=1024, progress=lambda _m: None,
        )  # fmt: skip
    assert caught.value.final


def test_the_worker_stores_the_per_rank_report(
    client: TestClient,
    runner: dict[str, str],
    app_env: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    bundle = kineto_bundle(salt="rank-exec")
    with tarfile.open(fileobj=io.BytesIO(bundle)) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest = parse_manifest(json.load(member), source="manifest.json")
    resp = client.post(
        "/api/v1/uploads/bundles", files={"bundle": ("b.tar.gz", bundle)}, headers=runner
    )
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["run_id"]
    settings = app_env["app"].state.settings.model_copy(update={"analysis_per_rank_min_bytes": 0})
    with caplog.at_level(logging.INFO, logger="cptrace.worker"):
        drain_worker(settings)
    assert "analysing 2 files per rank as 2 queue tasks" in caplog.messages
    status = client.get(f"/api/v1/runs/{run_id}/analysis").json()
    assert status["status"] == "done", status
    result = client.get(f"/api/v1/runs/{run_id}/analysis/result")
    stored, stored_report = result.json(), validate_report(result.text)
    # the sources name the uploaded members, never the worker's scratch links
    assert [s["path"] for s in stored["sources"]] == [
        "traces/rank0.json.gz",
        "traces/rank1.json.gz",
    ]
    inputs = _inputs(KINETO_RANK0, KINETO_RANK1)
    one_process = validate_report(analyze(inputs, manifest=manifest).model_dump_json())
    assert stored_report.model_dump_json() == one_process.model_dump_json()
    # the part blobs were reclaimed: the store holds only what uploads recorded
    db = app_env["db"]
    assert db.read(tasks.recorded_parts) == set()
    store = open_blobs(settings.blob_location, settings.tmp_dir)
    assert set(store.iter_digests()) <= db.read(recorded_digests)


def test_an_upload_sniffs_each_trace_once(tmp_path: Path) -> None:
    """The bundle reader sniffs each trace to check its listed format; the upload check takes
    that kind (it sniffed it a second time before), and the worker's inputs are typed."""
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(kineto_bundle(salt="sniff-once"))
    limits = Limits(max_decompressed_bytes=64 * MiB, max_members=16)
    with calls_of(_files.sniff) as seen:
        staged = stage_bundle(bundle, tmp_path / "blobs", tmp_path / "tmp", limits)
    traces = [f for f in staged.files if f.role == "trace"]
    assert len(seen) == len(traces) == 2
    stored = [{"format": f"{f.format}+gzip", "rank": f.rank, "name": f.name} for f in traces]
    typed = [trace_input(row, tmp_path / "link") for row in stored]
    assert typed == [
        TraceInput(path=tmp_path / "link", format="kineto", gzipped=True, rank=i, label=f.name)
        for i, f in enumerate(traces)
    ]


def test_a_rank_failing_for_good_fails_the_run_naming_its_rank(
    client: TestClient, runner: dict[str, str], app_env: dict[str, Any]
) -> None:
    """Each rank task under the memory limit: past it, the run fails for good, the error
    naming the rank and its file; the parts already written are deleted."""
    bundle = kineto_bundle(salt="rank-fails")
    resp = client.post(
        "/api/v1/uploads/bundles", files={"bundle": ("b.tar.gz", bundle)}, headers=runner
    )
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["run_id"]
    settings = app_env["app"].state.settings.model_copy(
        update={"analysis_per_rank_min_bytes": 0, "analysis_memory_limit_bytes": 64 * MiB}
    )
    drain_worker(settings)
    status = client.get(f"/api/v1/runs/{run_id}/analysis").json()
    assert status["status"] == "failed", status
    assert status["error"].startswith("rank 0 (traces/rank0.json.gz): the analysis needed more")
    assert app_env["db"].read(tasks.recorded_parts) == set()
