"""The line of a host sync from the profiled process's record, joined with Kineto's frame.

Kineto names a frame by the line it first saw (a function's def line, or the line running when
profiling started), never the line of the call. ``cptrace profile --torch`` records each
synchronizing CUDA call's line in the process (``runners/profile/synclines.py``) into the
manifest's ``sync_lines``; the host-sync pointer names that line, and falls back to Kineto's
line with the caveat when no record is its.

Real trace: ``tests/data/openworld/kineto_nccl_world1.json.gz``, a ``torch.cuda.synchronize()``
per step in ``main`` (``scripts/openworld/nccl_world1.py``: ``def main`` on line 12, the
synchronize on line 37), which Kineto names ``nccl_world1.py(33): main``: the line running when
profiling started. The records below are what the recorder writes for that call.

Real bundle: ``tests/data/plain-h200-profile/plain_mlp_adamw.tar.gz``, ``cptrace profile --torch``
of the unedited ``train.py`` beside it on one H200: its ``check_finite`` reads the loss with
``.item()`` on line 7, the line after its ``def``; the manifest holds the process's record.
"""

from __future__ import annotations

import gzip
import json
import tarfile
from typing import Any

import pytest
from testkit import DATA_DIR

from analyzers.bundle import read_bundle
from analyzers.findings.summary import LINE_CAVEAT, RECORDED_LINE, recorded_lines
from analyzers.manifest import ManifestError, RunManifest, SyncCallSite, parse_manifest
from analyzers.pipeline import run_analysis
from analyzers.report import TraceSummary

NCCL = DATA_DIR / "openworld" / "kineto_nccl_world1.json.gz"
SDPA = DATA_DIR / "openworld" / "kineto_sdpa_single_gpu.json.gz"
SCRIPT = "/srv/jobs/nccl_world1.py"
PLAIN = DATA_DIR / "plain-h200-profile"
PLAIN_BUNDLE = PLAIN / "plain_mlp_adamw.tar.gz"


def _site(**fields: Any) -> dict[str, Any]:
    site = {"file": SCRIPT, "line": 37, "function": "main", "first_line": 12, "count": 4,
            "message": "called a synchronizing CUDA operation"}  # fmt: skip
    return {**site, **fields}


def _manifest(*sites: dict[str, Any]) -> RunManifest:
    return parse_manifest({"sync_lines": [{"rank": 0, "mode": "warn", "sites": list(sites)}]})


def _summary(path: Any, manifest: RunManifest | None) -> TraceSummary:
    summary = run_analysis(path, manifest=manifest).report.summary
    assert summary is not None
    return summary


@pytest.fixture(scope="module")
def kineto_only() -> TraceSummary:
    return _summary(NCCL, None)


def test_the_recorded_line_replaces_kinetos_line(kineto_only: TraceSummary) -> None:
    (before,) = kineto_only.sync_pointers
    assert before.frame == "nccl_world1.py:33 in main" and before.call_lines == []
    summary = _summary(NCCL, _manifest(_site()))
    (pointer,) = summary.sync_pointers
    assert pointer.frame == "nccl_world1.py:37 in main"
    assert pointer.call_lines == [37]
    # everything else the trace measured is unchanged
    assert pointer.model_dump(exclude={"frame", "call_lines"}) == before.model_dump(
        exclude={"frame", "call_lines"}
    )
    (action,) = summary.do_first
    assert "at nccl_world1.py:37 in main out of the step" in action.action
    assert RECORDED_LINE in action.evidence and LINE_CAVEAT not in action.evidence
    assert action.saving_ms == kineto_only.do_first[0].saving_ms


@pytest.mark.parametrize(
    "site",
    [
        _site(function="train_step"),  # another function
        _site(file="/srv/jobs/other_nccl_world1.py"),  # not the same file
        _site(first_line=34),  # a function starting below Kineto's line: not this frame
    ],
    ids=["function", "file", "below"],
)
def test_without_a_record_of_its_function_the_pointer_keeps_kinetos_line(
    site: dict[str, Any], kineto_only: TraceSummary
) -> None:
    summary = _summary(NCCL, _manifest(site))
    assert summary.sync_pointers == kineto_only.sync_pointers
    (action,) = summary.do_first
    assert LINE_CAVEAT in action.evidence and "nccl_world1.py:33 in main" in action.action


def test_a_sync_that_waited_for_nothing_takes_no_record() -> None:
    """AdamW's ``.item()`` of CPU step counters, framed in the user's ``step``: no CUDA call,
    so no record can be its, even one naming that function."""
    record = _site(file="/srv/jobs/sdpa_model.py", function="step", first_line=40, line=49)
    summary = _summary(SDPA, _manifest(record))
    item = next(p for p in summary.sync_pointers if p.op == "aten::item")
    assert item.blocking_calls == 0
    assert item.frame == "sdpa_model.py:40 in step" and item.call_lines == []


def test_lines_of_one_function_most_calls_first_and_the_nearest_def() -> None:
    sites = [
        SyncCallSite.model_validate(s)
        for s in (
            _site(line=15, count=2),
            _site(line=37, count=9),
            _site(line=80, first_line=70, count=5),  # a second ``main`` further down the file
        )
    ]
    assert recorded_lines("nccl_world1.py:12 in main", sites) == [37, 15]  # its def line
    assert recorded_lines("nccl_world1.py:33 in main", sites) == [37, 15]  # running at start
    assert recorded_lines("nccl_world1.py:70 in main", sites) == [80]
    assert recorded_lines("jobs/nccl_world1.py:12 in main", sites) == [37, 15]
    assert recorded_lines("world1.py:12 in main", sites) == []  # a file name's tail is no file


def test_several_lines_are_all_named() -> None:
    summary = _summary(NCCL, _manifest(_site(line=37, count=3), _site(line=30, count=1)))
    (pointer,) = summary.sync_pointers
    assert pointer.frame == "nccl_world1.py:37,30 in main" and pointer.call_lines == [37, 30]


@pytest.mark.parametrize(
    ("sync_lines", "field"),
    [
        ([{"rank": 0, "mode": "warn", "sites": [_site(line=0)]}], "sync_lines.0.sites.0.line"),
        ([{"rank": 0, "mode": "loud", "sites": []}], "sync_lines.0.mode"),
        ([{"rank": -1, "mode": "warn"}], "sync_lines.0.rank"),
        ([{"rank": 0, "mode": "warn", "sites": [_site(count=0)]}], "sync_lines.0.sites.0.count"),
    ],
    ids=["line", "mode", "rank", "count"],
)
def test_a_bad_record_is_a_manifest_error_naming_the_field(
    sync_lines: list[dict[str, Any]], field: str
) -> None:
    with pytest.raises(ManifestError, match=rf"field {field}\b"):
        parse_manifest({"sync_lines": sync_lines})


def _plain_manifest() -> RunManifest:
    with read_bundle(PLAIN_BUNDLE) as bundle:
        return bundle.manifest


def test_the_real_h200_record_holds_the_item_line() -> None:
    source = (PLAIN / "train.py").read_text().splitlines()
    (rank,) = _plain_manifest().sync_lines
    assert rank.mode == "warn" and rank.dropped == rank.unplaced == 0
    (site,) = rank.sites  # one sync a step, 5 steps of the profiler (wait, warm-up, 3 active)
    assert (site.function, site.first_line, site.line, site.count) == ("check_finite", 6, 7, 5)
    assert site.file.endswith("/train.py")
    assert source[site.first_line - 1].startswith("def check_finite(")
    assert "loss.item()" in source[site.line - 1]
    assert site.message.startswith("called a synchronizing CUDA operation")


def test_the_real_h200_bundle_points_at_the_item_line_and_falls_back_without_record() -> None:
    summary = _summary(PLAIN_BUNDLE, None)  # the bundle's own manifest
    pointer = next(p for p in summary.sync_pointers if p.op == "aten::item" and p.blocking_calls)
    assert pointer.frame == "train.py:7 in check_finite" and pointer.call_lines == [7]
    assert (pointer.calls, pointer.step_calls, pointer.blocking_calls) == (3, 3, 6)
    first = summary.do_first[0]
    assert first.action.startswith("Take the host sync (aten::item) at train.py:7 in check_finite")
    assert RECORDED_LINE in first.evidence
    # AdamW's .item() of its CPU step counters blocked on nothing: no record is theirs
    idle = next(p for p in summary.sync_pointers if p.op == "aten::item" and not p.blocking_calls)
    assert idle.call_lines == [] and idle.frame == "train.py:25 in main"

    unrecorded = _plain_manifest().model_copy(update={"sync_lines": []})
    before = _summary(PLAIN_BUNDLE, unrecorded)  # what the trace alone gives: the def line
    pointer = next(p for p in before.sync_pointers if p.op == "aten::item" and p.blocking_calls)
    assert pointer.frame == "train.py:6 in check_finite" and pointer.call_lines == []
    assert "at train.py:6 in check_finite" in before.do_first[0].action
    assert LINE_CAVEAT in before.do_first[0].evidence


def test_the_profilers_own_sync_under_cptraces_hook_is_no_pointer() -> None:
    """The PyTorch profiler synchronizes the device when it stops tracing, from cptrace's
    ``runners/profile/torchprof.py`` step hook inside the user's ``opt.step()``: that sync is in
    the trace, but it is cptrace's, so no pointer names it (nor the user's line around it)."""
    with tarfile.open(PLAIN_BUNDLE) as archive:
        member = next(m for m in archive.getnames() if m.endswith(".json.gz"))
        raw = archive.extractfile(member)
        assert raw is not None
        events = [e for e in json.loads(gzip.decompress(raw.read()))["traceEvents"]
                  if e.get("ph") == "X"]  # fmt: skip
    (sync,) = [e for e in events if e["name"] == "cudaDeviceSynchronize"]
    around = [e["name"] for e in events if e.get("cat") == "python_function"
              and e["tid"] == sync["tid"] and e["ts"] <= sync["ts"]
              and e["ts"] + e["dur"] >= sync["ts"] + sync["dur"]]  # fmt: skip
    assert any(n.startswith("runners/profile/torchprof.py(") for n in around)
    assert "train.py(25): main" in around
    summary = _summary(PLAIN_BUNDLE, None)
    assert [p.op for p in summary.sync_pointers] == ["aten::item", "aten::item"]
    assert not [p for p in summary.sync_pointers if "runners/profile" in p.frame]
