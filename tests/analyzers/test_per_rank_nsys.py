"""A bundle of one Nsight Systems export per rank (each export one process, numbered rank 0 by
its own file): each export takes the rank the bundle's manifest lists for it, read in one process
and as per-rank parts alike; two exports listed with the same rank are a clear error."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from testkit import shared_traces_dir

from analyzers.bundle import BundleManifestError, read_bundle
from analyzers.errors import RankConflictError
from analyzers.pipeline import analyze
from analyzers.rank_parts import analyze_rank, dump_part, merge_part_blobs
from analyzers.readers import read_trace
from analyzers.report import AnalysisReport

EXPORT = "synthetic-h200x2/nsys_single.sqlite.gz"


def _per_rank_bundle(root: Path, ranks: list[int]) -> Path:
    """A bundle directory: the real one-process export copied once per listed rank."""
    source = shared_traces_dir() / EXPORT
    (root / "traces").mkdir(parents=True)
    listed = []
    for i, rank in enumerate(ranks):
        member = f"traces/export{i}.sqlite.gz"  # no rank in the name: only the manifest says it
        shutil.copyfile(source, root / member)
        digest = hashlib.sha256((root / member).read_bytes()).hexdigest()
        listed.append({"path": member, "format": "nsys", "rank": rank, "sha256": digest})
    manifest = {
        "schema_version": 1,
        "bundle_version": 1,
        "run": {"name": "per-rank-nsys", "branch": "main", "commit": "abc123",
                "created_at": "2026-01-01", "spec": {"name": "per-rank-nsys"}, "host": "test"},
        "traces": listed,
    }  # fmt: skip
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_the_export_alone_claims_rank_0() -> None:
    trace = read_trace(shared_traces_dir() / EXPORT)
    assert trace.rank_list() == [0]  # why the manifest's rank must win for a per-rank bundle


@pytest.mark.parametrize("ranks", [[0, 1], [1, 0], [2, 3]])
def test_each_export_takes_its_listed_rank(ranks: list[int], tmp_path: Path) -> None:
    bundle = _per_rank_bundle(tmp_path / "bundle", ranks)
    assert [t.rank for t in read_bundle(bundle).traces] == ranks
    report = analyze([bundle])
    assert report.ranks == sorted(ranks)
    alone = _figures(analyze([shared_traces_dir() / EXPORT]), 0)
    assert alone and sum(k for _, k, _ in alone) > 0
    for rank in ranks:  # every rank holds its export's figures, as the export alone has them
        assert _figures(report, rank) == alone


def _figures(report: AnalysisReport, rank: int) -> list[tuple[str, int, int]]:
    return sorted(
        (s.window, s.kernels, s.gpu_busy_ns) for s in report.rank_summaries if s.rank == rank
    )


def test_two_exports_listed_with_one_rank_are_refused(tmp_path: Path) -> None:
    bundle = _per_rank_bundle(tmp_path / "bundle", [1, 1])
    both = "traces/export0.sqlite.gz and traces/export1.sqlite.gz are both listed as nsys rank 1"
    with pytest.raises(BundleManifestError, match=both):
        read_bundle(bundle)
    with pytest.raises(BundleManifestError, match=both):
        analyze([bundle])


def test_two_exports_of_one_rank_are_refused_without_a_bundle(tmp_path: Path) -> None:
    """The same pair as bare files (no manifest): both claim rank 0, and the merge says so."""
    first, second = tmp_path / "a.sqlite.gz", tmp_path / "b.sqlite.gz"
    shutil.copyfile(shared_traces_dir() / EXPORT, first)
    shutil.copyfile(shared_traces_dir() / EXPORT, second)
    with pytest.raises(RankConflictError, match="rank 0"):
        analyze([first, second])


def test_per_rank_parts_give_the_one_process_report(tmp_path: Path) -> None:
    """The service's path: each export a rank task of its own (its part blob), then the merge."""
    bundle = _per_rank_bundle(tmp_path / "bundle", [1, 0])
    today = analyze(bundle).model_dump_json()
    with read_bundle(bundle) as opened:
        items = [t.as_input(label=f"{bundle.name}:{t.member}") for t in opened.analysis_traces()]
        blobs = []
        for i, item in enumerate(items):
            blobs.append(tmp_path / f"part{i}.npz")
            dump_part(analyze_rank(item, files=len(items)), blobs[-1])
        merged = merge_part_blobs(blobs, manifest=opened.manifest).report
    assert merged.ranks == [0, 1]
    assert merged.model_dump_json() == today
