"""``cptrace profile --probe`` of a plain torch job (issue 25): the probe says it saw no TE or
cp_attn call instead of recording ``sites: {}`` silently, and ``run.command`` records
cptrace's own options beside the job's command line."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cptrace.cli import app
from runners.profile.probe.record import NO_CALL
from runners.profile.run import ProfileOptions, options_argv

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "scripts" / "plain_torch.py"


def test_probe_of_a_job_without_te_or_cp_attn_says_so(tmp_path: Path) -> None:
    out = tmp_path / "plain"
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


def test_options_argv_records_only_what_differs_and_redacts() -> None:
    assert options_argv(ProfileOptions()) == ["--no-nsys"]
    argv = options_argv(
        ProfileOptions(nsys=True, nsys_extra=("--env-var", "X=1"), hang_timeout_s=None,
                       with_stack=False, delay_s=2.5)
    )  # fmt: skip
    assert argv == ["--nsys", "--nsys-args", "--env-var X=1", "--delay", "2.5",
                    "--hang-timeout", "0", "--no-stack"]  # fmt: skip
