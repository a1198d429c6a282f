"""The stage benchmark runs end to end on the real 3-arm nsys export, paired with a second tree
(here the same one): every stage row is printed for both trees and the account's share line is
there. A smoke run of the script, not a measurement: no time is asserted."""

import subprocess
import sys
from pathlib import Path

import pytest
from testkit import script_module

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

ROOT = Path(__file__).resolve().parents[2]


def test_paired_run_prints_every_stage_for_both_trees() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "analyze_stages.py"), "--base", str(ROOT),
         "--input", "nsys", "--repeat", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("nsys 3 arms: 19,010 activities") for line in lines)
    for stage in ("read", "attribute", "metrics", "account", "findings", "report", "total"):
        row = next(line for line in lines if line.startswith(f"| {stage} |"))
        assert len(row.strip("|").split("|")) == 7  # stage, 2 x (cpu, wall), 2 deltas
    assert any(line.startswith("account adds (current):") for line in lines)


def _stages_module() -> object:
    return script_module(ROOT / "benchmarks" / "analyze_stages.py")


def _runs(cpu: dict[str, float]) -> list[dict[str, object]]:
    return [{"cpu": dict(cpu)}]


def test_guard_flags_only_growth_past_threshold_and_floor() -> None:
    stages = _stages_module()
    base = {"read": 1.0, "attribute": 0.05, "metrics": 0.06, "account": 0.09,
            "findings": 0.002, "report": 0.01, "total": 1.3}  # fmt: skip
    same = stages.guard_failures({"base": _runs(base), "current": _runs(base)}, 0.10, 0.005)  # type: ignore[attr-defined]
    assert same == []
    grown = {**base, "read": 1.2, "findings": 0.004, "metrics": 0.065, "total": 1.5}
    found = stages.guard_failures({"base": _runs(base), "current": _runs(grown)}, 0.10, 0.005)  # type: ignore[attr-defined]
    # findings doubled but by 2 ms (under the floor); metrics grew 8%: neither counts
    assert [line.split(":")[0] for line in found] == ["read", "total"]
    assert "+20.0%" in found[0]


def test_guard_mode_pairs_a_commit_worktree_and_exits_1_on_growth() -> None:
    # A limit every run exceeds: the exit status and the listing of the failing rows are
    # checked without depending on the machine's noise; the temporary worktree is removed.
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "analyze_stages.py"), "--guard", "HEAD",
         "--input", "nsys", "--repeat", "1", "--threshold", "-1", "--floor", "-1000"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("| read |") for line in lines)
    assert "guard against HEAD: FAIL" in lines
    assert sum(line.startswith("  nsys 3 arms: ") for line in lines) == 7  # 6 stages + total
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list", "--porcelain"], capture_output=True, text=True
    )
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    # this run's worktree is gone (a guard of another commit, run by another checkout of the
    # same repository at the same time, may be listed: worktrees are shared)
    trees = listed.stdout.split("\n\n")
    assert not [t for t in trees if "cptrace-guard-" in t and f"HEAD {head}" in t]


def test_cli_mode_times_the_whole_command_and_its_own_cost() -> None:
    # The real `cptrace analyze` in a fresh interpreter: every CLI row, and the parts add up
    # to the process (the analysis and the three pieces of the command's own cost).
    stages = _stages_module()
    argv = stages.cli_args([ROOT / "tests/data/te-2.20.2-h200x2/nsys_3arms.sqlite.gz"],  # type: ignore[attr-defined]
                           "^nsys_arm:", ["findings"])  # fmt: skip
    run = stages.run_cli_child(ROOT, argv)  # type: ignore[attr-defined]
    for clock in ("cpu", "wall"):
        row = run[clock]
        assert set(stages.CLI_ROWS) <= set(row)  # type: ignore[attr-defined]
        assert row["analyze"] > 0 and row["pipeline import"] > 0
        parts = row["analyze"] + row["start, CLI import, exit"] + row["pipeline import"]
        assert abs(parts + row["render + rest"] - row["process"]) < 1e-6
    assert run["wall"]["process"] >= run["wall"]["analyze"]
    assert run["rss_mb"] > 0
