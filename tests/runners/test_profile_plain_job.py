"""``cptrace profile --probe`` of a plain torch job (issue 25): the probe says it saw no TE or
cp_attn call instead of recording ``sites: {}`` silently, and ``run.command`` records
cptrace's own options beside the job's command line."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from analyzers.findings.summary import LINE_CAVEAT
from analyzers.pipeline import analyze
from cptrace.cli import app
from runners.profile.probe.record import NO_CALL
from runners.profile.run import ProfileOptions, options_argv

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "scripts" / "plain_torch.py"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """``cptrace profile --torch --probe`` of the plain job, on CPU: (bundle, CLI result)."""
    out = tmp_path_factory.mktemp("plain") / "plain"
    args = [
        "profile",
        "--no-nsys",
        "--torch",
        "--probe",
        "--time-warmup",
        "2",
        "--name",
        "plain job",
        "--out",
        str(out),
        "--timeout",
        "120",
        "--",
        sys.executable,
        str(SCRIPT),
    ]
    result = CliRunner().invoke(app, args)  # fmt: skip
    assert result.exit_code == 0, result.output
    return out, result


def test_probe_of_a_job_without_te_or_cp_attn_says_so(profiled: tuple[Path, Any]) -> None:
    out, result = profiled
    assert f"cptrace: --probe: {NO_CALL}" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    (record,) = manifest["probe"].values()
    assert record["sites"] == {} and record["note"].startswith(NO_CALL)
    command = shlex.split(manifest["run"]["command"])
    assert command[:2] == ["cptrace", "profile"]
    own = command[2 : command.index("--")]
    assert own == ["--no-nsys", "--torch", "--probe", "--time-warmup", "2", "--timeout", "120",
                   "--name", "plain job"]  # fmt: skip
    assert command[command.index("--") + 1 :] == [sys.executable, str(SCRIPT)]


def test_on_cpu_no_sync_line_is_recorded_and_the_pointer_keeps_kinetos_line(
    profiled: tuple[Path, Any],
) -> None:
    """No CUDA, no CUDA sync: the manifest says so (``no_cuda``) and the ``.item()`` of the
    loss (line 16) is pointed at the line Kineto names (15, ``opt.step()`` running when the
    profiler started at the first optimizer step), with the caveat."""
    out, _ = profiled
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sync_lines"] == [
        {"rank": 0, "mode": "no_cuda", "sites": [], "dropped": 0, "unplaced": 0}
    ]
    summary = analyze(out).summary
    assert summary is not None
    (pointer,) = [p for p in summary.sync_pointers if p.op == "aten::item"]
    assert pointer.frame == "plain_torch.py:15 in <module>" and pointer.call_lines == []
    (action,) = [a for a in summary.do_first if a.rule == "host-sync-in-step"]
    assert LINE_CAVEAT in action.evidence


def test_options_argv_records_only_what_differs_and_redacts() -> None:
    assert options_argv(ProfileOptions()) == ["--no-nsys"]
    argv = options_argv(
        ProfileOptions(nsys=True, nsys_extra=("--env-var", "X=1"), hang_timeout_s=None,
                       with_stack=False, delay_s=2.5)
    )  # fmt: skip
    assert argv == ["--nsys", "--nsys-args", "--env-var X=1", "--delay", "2.5",
                    "--hang-timeout", "0", "--no-stack"]  # fmt: skip


def test_no_sync_lines_reaches_the_ranks_and_run_command(tmp_path: Path) -> None:
    from runners.profile.run import child_environment
    from runners.profile.torchprof import TORCH_PROFILE_ENV, TorchProfileConfig

    off = ProfileOptions(torch=True, sync_lines=False)
    assert options_argv(off) == ["--no-nsys", "--torch", "--no-sync-lines"]
    config = TorchProfileConfig.from_env(child_environment(off, tmp_path)[TORCH_PROFILE_ENV])
    assert config.sync_lines is False
    on = TorchProfileConfig.from_env(
        child_environment(ProfileOptions(torch=True), tmp_path)[TORCH_PROFILE_ENV]
    )
    assert on.sync_lines is True
