"""Rank of trace files that do not say it: a lone file is rank 0 (noted), ``--rank N`` sets it,
several such files are refused with a message naming the option. Through the real CLI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from testkit import DATA_DIR
from typer.testing import CliRunner

from cptrace.cli import app

SYNTH = DATA_DIR / "synthetic-h200x2" / "kineto_rank0.json.gz"
RUNNER = CliRunner()


def _rankless(tmp_path: Path, name: str) -> Path:
    """The real synthetic rank-0 trace without distributedInfo, under a name without a rank."""
    doc = json.loads(gzip.decompress(SYNTH.read_bytes()))
    doc.pop("distributedInfo")
    out = tmp_path / name
    out.write_text(json.dumps(doc))
    return out


def test_lone_rankless_file_is_rank_0_with_a_note(tmp_path: Path) -> None:
    path = _rankless(tmp_path, "profile.json")
    result = RUNNER.invoke(app, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ranks"] == [0]
    assert any("analysed as rank 0" in n for n in report["notes"])


def test_rank_option_sets_the_rank_of_one_file(tmp_path: Path) -> None:
    path = _rankless(tmp_path, "profile.json")
    result = RUNNER.invoke(app, ["analyze", str(path), "--rank", "3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ranks"] == [3]
    assert {h["rank"] for h in report["helpers"]} == {3}
    assert not any("analysed as rank 0" in n for n in report["notes"])


def test_several_rankless_files_are_an_error_naming_the_option(tmp_path: Path) -> None:
    paths = [str(_rankless(tmp_path, n)) for n in ("a.json", "b.json")]
    result = RUNNER.invoke(app, ["analyze", *paths])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and "--rank N" in result.output
    assert "Traceback" not in result.output
    result = RUNNER.invoke(app, ["analyze", *paths, "--rank", "1"])
    assert result.exit_code == 1 and "2 were given" in result.output
