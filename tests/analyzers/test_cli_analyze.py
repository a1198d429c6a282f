"""``cptrace analyze`` / ``compare`` / ``catalog`` through Typer's CliRunner."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from testkit import DATA_DIR
from typer.testing import CliRunner

from cptrace.cli import app
from tests.analyzers.conftest import KINETO_3ARMS, NSYS_3ARMS, WORKLOAD, te_manifest

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

RUNNER = CliRunner()
SYNTHETIC = DATA_DIR / "synthetic-h200x2"


def _invoke(*args: str):
    return RUNNER.invoke(app, list(args), catch_exceptions=False)


def test_every_command_has_help_with_an_example() -> None:
    for command in ("analyze", "compare", "catalog"):
        result = _invoke(command, "--help")
        assert result.exit_code == 0 and "Example:" in result.output


def test_analyze_json_is_a_report() -> None:
    result = _invoke("analyze", str(NSYS_3ARMS), "--step-pattern", "^nsys_arm:", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["groups"][0] == "nsys_arm:auto_clone"
    assert any(h["helper"] == "get_cu_seqlens_on_cp_rank" for h in report["helpers"])


def test_analyze_tables_show_helpers_and_findings(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(te_manifest("arm").model_dump_json())
    result = _invoke("analyze", *map(str, KINETO_3ARMS), "--manifest", str(manifest))
    assert result.exit_code == 0, result.output
    for text in (
        "arm:auto_clone: helpers, per step (total / steps)",
        "get_cu_seqlens_on_cp_rank",
        "Findings",
        "padded-path-without-padding",
        "pad_between_seqs=False",
        "Iteration time",
        "arm:auto_clone: GPU timeline (clipped to the windows), per step",
        "GPU devices, totals over the whole trace",
        "Kernels, whole trace, all ranks",
        "whole trace: helpers, totals over the whole trace",
    ):
        assert text in result.output
    # the whole-trace tables never say "per step" and the evidence says how it divides
    whole = result.output[result.output.index("whole trace: helpers") :]
    assert "/step" not in whole.split("GPU devices")[0]
    assert "CPU launch calls per step (total / 3 steps)" in result.output


def test_analyze_json_is_complete() -> None:
    args = ["analyze", *map(str, KINETO_3ARMS), "--step-pattern", "^arm:", "--json"]
    report = json.loads(_invoke(*args, "--full").output)
    for key in ("gpu_timeline", "window_timelines", "devices", "kernels", "environment"):
        assert report[key], key
    # without --full the timelines are left out, everything else is the same
    lean = json.loads(_invoke(*args).output)
    timelines = {"timeline", "other_timelines", "gpu_timeline", "window_timelines"}
    assert timelines <= set(report) and not timelines & set(lean)
    assert lean == {k: v for k, v in report.items() if k not in timelines}
    assert report["environment"]["gpu_models"] == ["NVIDIA H200"]
    assert {k["rank"] for k in report["kernels"]} == {0, 1, None}


def test_compare_two_windows_of_one_run_and_a_saved_report(tmp_path: Path) -> None:
    args = [
        "--base",
        str(KINETO_3ARMS[0]),
        "--base",
        str(KINETO_3ARMS[1]),
        "--step-pattern",
        "^arm:",
        "--base-window",
        "arm:auto_clone",
        "--head-window",
        "arm:explicit_false",
    ]
    result = _invoke("compare", *args)
    assert result.exit_code == 0, result.output
    assert "get_cu_seqlens_on_cp_rank -32 (disappeared" in result.output.replace("\n", " ")
    saved = tmp_path / "report.json"
    saved.write_text(
        _invoke("analyze", *map(str, KINETO_3ARMS), "--step-pattern", "^arm:", "--json").output
    )
    result = _invoke(
        "compare",
        "--base",
        str(saved),
        "--base-window",
        "arm:auto_clone",
        "--head-window",
        "arm:auto_same",
        "--json",
    )
    comparison = json.loads(result.output)
    assert comparison["base_label"] == "arm:auto_clone"
    assert comparison["helpers"][0]["helper"] == "get_cu_seqlens_on_cp_rank"
    assert comparison["kernel_deltas"] and comparison["total_gpu"]["base_ns"] > 0
    assert [r["rank"] for r in comparison["ranks"]] == [0, 1] and comparison["notes"] == []


def test_compare_tables_label_sides_and_warn_on_different_runs() -> None:
    result = _invoke(
        "compare",
        "--base",
        str(SYNTHETIC / "nsys_single.sqlite.gz"),
        "--head",
        str(KINETO_3ARMS[0]),
        "--head",
        str(KINETO_3ARMS[1]),
    )
    assert result.exit_code == 0, result.output
    out = result.output.replace("\n", " ")
    assert "warning: different rank sets" in out
    assert "Findings, base (whole trace)" in out and "Findings, head (whole trace)" in out
    assert "Total GPU (whole trace, summed over ranks)" in out
    assert "Kernels, whole trace, summed over ranks" in out


def test_catalog_command(tmp_path: Path) -> None:
    assert "get_cu_seqlens_on_cp_rank" in _invoke("catalog").output
    extra = tmp_path / "extra.toml"
    extra.write_text('[[helper]]\nname = "my_helper"\ncategory = "metadata"\nranges = ["mine"]\n')
    listed = json.loads(_invoke("catalog", "--catalog", str(extra), "--json").output)
    assert listed["helpers"][0]["name"] == "my_helper"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: ["analyze", str(d / "missing.json")], "missing.json"),
        (
            lambda d: [
                "analyze",
                str(SYNTHETIC / "kineto_rank0.json.gz"),
                "--manifest",
                str(d / "bad.json"),
            ],
            "bad.json",
        ),
        (lambda d: ["analyze", str(d / "not_a_trace.json")], "not_a_trace.json"),
        (
            lambda d: ["analyze", str(SYNTHETIC / "kineto_rank0.json.gz"), "--step-pattern", "("],
            "missing )",
        ),
        (
            lambda d: [
                "analyze",
                str(SYNTHETIC / "kineto_rank0.json.gz"),
                "--catalog",
                str(d / "bad.toml"),
            ],
            "bad.toml",
        ),
        (
            lambda d: [
                "compare",
                "--base",
                str(SYNTHETIC / "kineto_rank0.json.gz"),
                "--base-window",
                "arm:nope",
            ],
            "arm:nope",
        ),
    ],
)
def test_bad_input_is_a_clean_error(tmp_path: Path, make, message: str) -> None:
    (tmp_path / "bad.json").write_text('{"schema_version": 1, "workload": {"cp_size": "two"}}')
    (tmp_path / "not_a_trace.json").write_text('{"hello": "world"}')
    (tmp_path / "bad.toml").write_text("[[helper]]\nname = 'x'\n")
    result = RUNNER.invoke(app, make(tmp_path))
    assert result.exit_code == 1, result.output
    assert "Error" in result.output and message in result.output
    assert "Traceback" not in result.output


def _bundle(root: Path) -> Path:
    bundle = root / "bundle"
    (bundle / "traces").mkdir(parents=True)
    entries = []
    for rank, src in enumerate(KINETO_3ARMS):
        shutil.copy(src, bundle / "traces" / src.name)
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        entries.append(
            {"path": f"traces/{src.name}", "format": "kineto", "rank": rank, "sha256": digest}
        )
    manifest = json.loads(te_manifest("arm").model_dump_json())
    manifest.update(
        {"bundle_version": 1, "run": {"name": "te-3arms"}, "traces": entries, "workload": WORKLOAD}
    )
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def test_analyze_a_bundle_directory_and_tar(tmp_path: Path) -> None:
    pytest.importorskip("analyzers.bundle")
    bundle = _bundle(tmp_path)
    result = _invoke("analyze", str(bundle), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["groups"][:3] == ["arm:auto_clone", "arm:explicit_false", "arm:auto_same"]
    assert any(f["rule"] == "padded-path-without-padding" for f in report["findings"])
    tar = tmp_path / "bundle.tar.gz"
    with tarfile.open(tar, "w:gz") as out:
        out.add(bundle, arcname="bundle")
    report = json.loads(_invoke("analyze", str(tar), "--json").output)
    assert report["ranks"] == [0, 1]


def test_progress_bar_only_on_a_terminal_after_a_second() -> None:
    """No bar when stderr is not a terminal (CliRunner); the real analysis with the bar's
    callback: none before ``show_after_s``, shown from the first stage after it."""
    from analyzers import analyze
    from cptrace.commands._progress import LateProgress

    result = CliRunner().invoke(app, ["analyze", str(SYNTHETIC / "nsys_single.sqlite.gz")])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    trace = SYNTHETIC / "nsys_single.sqlite.gz"
    with LateProgress(show_after_s=3600.0) as late:
        analyze(trace, progress=late)
    assert not late.shown
    with LateProgress(show_after_s=0.0) as early:
        analyze(trace, progress=early)
    assert early.shown
