"""Launcher selection, command lines, ABBA order and the CLI's error edges (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import demo_bundle
from typer.testing import CliRunner

from cptrace.cli import app
from runners.launch import launcher_command, rank_command, resolve_launcher, run_spec
from runners.spec import parse_spec
from runners.workload import abba_order


def test_slurm_is_detected_only_with_srun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runners.launch.shutil.which", lambda name: f"/usr/bin/{name}")
    assert resolve_launcher("auto", {"SLURM_JOB_ID": "42"}) == "srun"
    assert resolve_launcher("auto", {}) == "torchrun"
    assert resolve_launcher("torchrun", {"SLURM_JOB_ID": "42"}) == "torchrun"
    monkeypatch.setattr("runners.launch.shutil.which", lambda name: None)
    assert resolve_launcher("auto", {"SLURM_JOB_ID": "42"}) == "torchrun"
    with pytest.raises(ValueError, match="launcher must be"):
        resolve_launcher("mpirun", {})


def test_cpu_specs_fork_their_ranks_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runners.launch.shutil.which", lambda name: f"/usr/bin/{name}")
    assert resolve_launcher("auto", {}, cpu=True) == "fork"
    assert resolve_launcher("auto", {"SLURM_JOB_ID": "42"}, cpu=True) == "srun"
    assert resolve_launcher("torchrun", {}, cpu=True) == "torchrun"
    assert resolve_launcher("fork", {}) == "fork"


def test_command_lines(tmp_path: Path) -> None:
    per_rank = rank_command(tmp_path / "spec.json", tmp_path, ["timed", "torch"])
    assert per_rank[:2] == ["-m", "runners.workload"] and per_rank[-1] == "timed,torch"
    torchrun = launcher_command("torchrun", 2, per_rank)
    assert torchrun[1:5] == ["-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=2"]
    srun = launcher_command("srun", 8, per_rank)
    assert srun[:3] == ["srun", "--ntasks=8", "--kill-on-bad-exit=1"]
    fork = launcher_command("fork", 4, per_rank)
    assert fork[1:4] == ["-m", "runners.forkrun", "--nproc=4"] and fork[4:] == per_rank


def test_abba_order() -> None:
    arms = ["A", "B", "C"]
    rounds = [abba_order(arms, r) for r in range(4)]  # type: ignore[arg-type]
    assert rounds == [["A", "B", "C"], ["C", "B", "A"], ["A", "B", "C"], ["C", "B", "A"]]


def test_run_refuses_a_non_empty_out(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "manifest.json").write_text("{}")
    spec = parse_spec({"name": "x", "device": "cpu"})
    with pytest.raises(FileExistsError, match="not empty"):
        run_spec(spec, tmp_path / "old")
    assert (tmp_path / "old" / "manifest.json").read_text() == "{}"


def test_nproc_revalidates_the_spec(tmp_path: Path) -> None:
    spec = parse_spec({"name": "x", "device": "cpu", "seqlens": [4, 4]})
    with pytest.raises(Exception, match=r"--nproc: field seqlens: DualChunkSwap needs .*=8"):
        run_spec(spec, tmp_path / "new", _opts(nproc=4))


def _opts(**kw: object):
    from runners.launch import LaunchOptions

    return LaunchOptions(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", ["run", "upload", "agent", "bundle check", "bundle pack"])
def test_commands_have_help_with_an_example(command: str) -> None:
    result = CliRunner().invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0
    assert "Example: cptrace" in result.output


def test_cli_run_reports_an_invalid_spec(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nstrategy: zigzag\n")
    result = CliRunner().invoke(app, ["run", str(spec), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "field strategy" in result.output
    assert not (tmp_path / "o").exists()


def test_cli_bundle_check_refuses_a_tampered_bundle(tmp_path: Path) -> None:
    synthetic = demo_bundle("synthetic-h200x2-nsys")
    ok = CliRunner().invoke(app, ["bundle", "check", str(synthetic)])
    assert ok.exit_code == 0 and "ok: bundle_version 1" in ok.output
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"\x1f\x8b\x08not a tar")
    result = CliRunner().invoke(app, ["bundle", "check", str(bad)])
    assert result.exit_code == 1 and "not a readable tar archive" in result.stderr
