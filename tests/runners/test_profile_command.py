"""``cptrace profile`` command lines: nsys inserted per rank, secrets redacted, nsys missing."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cptrace.cli import app
from runners.profile.command import (
    NSYS_INSTALL_HINT,
    NsysPlan,
    ProfileCommandError,
    find_nsys,
    parse_launch,
    redact_argv,
    wrapped_command,
)
from runners.profile.probe.record import SamplingPolicy
from runners.profile.run import ProfileOptions, child_environment, profile_command

PY = "/usr/bin/python3"


def _plan(tmp_path: Path, **kw: object) -> NsysPlan:
    return NsysPlan(nsys_cmd=["/opt/nsys/bin/nsys"], out_dir=tmp_path, **kw)  # type: ignore[arg-type]


def test_torchrun_gets_nsys_inside_each_rank(tmp_path: Path) -> None:
    launch = parse_launch(
        ["torchrun", "--nproc-per-node", "2", "--standalone", "train.py", "--lr", "3"], python=PY
    )
    assert launch.kind == "torchrun"
    cmd = wrapped_command(launch, _plan(tmp_path, functions_json=tmp_path / "f.json"))
    nsys_at = cmd.index("/opt/nsys/bin/nsys")
    # torchrun's own options, then --no-python so each rank runs nsys, which runs python.
    assert cmd[:nsys_at] == ["torchrun", "--nproc-per-node", "2", "--standalone", "--no-python"]
    assert cmd[-4:] == [PY, "train.py", "--lr", "3"]
    nsys_args = cmd[nsys_at:-4]
    assert nsys_args[1] == "profile"
    assert nsys_args[nsys_args.index("-o") + 1] == f"{tmp_path}/nsys_rank%q{{RANK}}_pid%p"
    assert f"--python-functions-trace={tmp_path / 'f.json'}" in nsys_args
    assert not any(a.startswith("--capture-range") for a in nsys_args)


def test_module_mode_and_srun_and_single(tmp_path: Path) -> None:
    launch = parse_launch(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", "-m", "pkg.train"],
        python=PY,
    )
    assert launch.launcher[-1] == "--no-python" and launch.program == [PY, "-m", "pkg.train"]
    srun = parse_launch(["srun", "--ntasks=8", "-N", "2", "python", "t.py"], python=PY)
    assert srun.kind == "srun" and srun.launcher == ["srun", "--ntasks=8", "-N", "2"]
    cmd = wrapped_command(srun, _plan(tmp_path, capture_range=True))
    assert f"{tmp_path}/nsys_rank%q{{SLURM_PROCID}}_pid%p" in cmd
    assert "--capture-range=cudaProfilerApi" in cmd and cmd[-2:] == ["python", "t.py"]
    single = parse_launch(["python", "train.py"], python=PY)
    cmd = wrapped_command(single, _plan(tmp_path, delay_s=5, duration_s=20,
                                        extra_args=("--gpu-metrics-devices=all",)))
    assert cmd[0] == "/opt/nsys/bin/nsys" and cmd[-2:] == ["python", "train.py"]
    assert "--delay=5" in cmd and "--duration=20" in cmd and "--gpu-metrics-devices=all" in cmd
    assert f"{tmp_path}/nsys_rank0_pid%p" in cmd
    with pytest.raises(ProfileCommandError, match="torchrun --nproc-per-node 2: no program"):
        parse_launch(["torchrun", "--nproc-per-node", "2"], python=PY)


def test_profile_command_with_nsys_uses_the_catalog_trace_file(tmp_path: Path) -> None:
    extra: dict[str, object] = {}
    opts = ProfileOptions(nsys=True, nsys_cmd=(sys.executable,), delay_s=2.0)
    launch, cmd = profile_command(["python", "train.py"], opts, tmp_path, extra)
    assert launch.kind == "single" and cmd[:2] == [sys.executable, "profile"]
    assert "--delay=2" in cmd and cmd[-2:] == ["python", "train.py"]
    traced = extra["nsys_python_functions"]
    has_te = importlib.util.find_spec("transformer_engine") is not None
    # The file is generated from the catalog for the installed TE; without TE it is empty and
    # the flag is left out (nsys refuses an empty list).
    assert bool(traced) == has_te
    assert any(a.startswith("--python-functions-trace=") for a in cmd) == has_te
    with pytest.raises(ProfileCommandError, match="nothing to do"):
        profile_command(["python", "t.py"], ProfileOptions(), tmp_path, {})


def test_nsys_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileCommandError, match="not on PATH"):
        find_nsys(["nsys-not-installed-here"])
    result = CliRunner().invoke(
        app, ["profile", "--nsys", "--nsys-cmd", str(tmp_path / "nsys"), "--out",
              str(tmp_path / "b"), "--", sys.executable, "-c", "pass"],
    )
    assert result.exit_code == 2
    assert "not an executable file" in result.output and "Nsight Systems" in result.output
    assert NSYS_INSTALL_HINT.split(".")[0] in " ".join(result.output.split())
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_secrets_are_redacted_and_env_never_recorded(tmp_path: Path) -> None:
    argv = ["python", "t.py", "--wandb-api-key", "abc", "--token=xyz", "HF_TOKEN=s3cret", "--lr",
            "3"]
    assert redact_argv(argv) == [
        "python", "t.py", "--wandb-api-key", "***", "--token=***", "HF_TOKEN=***", "--lr", "3"
    ]
    env = child_environment(ProfileOptions(probe=True, torch=True), tmp_path)
    assert env["PYTHONPATH"].split(":")[0].endswith("runners/profile/bootstrap")
    assert json.loads(env["CPTRACE_PROBE"])["out_dir"] == str(tmp_path / "probe")
    assert json.loads(env["CPTRACE_TORCH_PROFILE"])["step_on"] == "optimizer"


def test_sampling_policy() -> None:
    policy = SamplingPolicy(first=3, every=10)
    assert [i for i in range(1, 40) if policy.sampled(i)] == [1, 2, 3, 13, 23, 33]
    assert [i for i in range(1, 6) if SamplingPolicy(first=2, every=0).sampled(i)] == [1, 2]


def test_the_probe_never_raises_into_the_job() -> None:
    from runners.profile.probe.record import ProbeState
    from runners.profile.probe.wrappers import CP_ATTN_SITE, _wrap_cp_attn

    state = ProbeState(rank=0, policy=SamplingPolicy(first=2, every=0))
    attention = _wrap_cp_attn(state, lambda q, k, v, meta, **kw: ("ran", q))
    # A metadata object the probe cannot read: the call still runs, the error is recorded.
    assert attention("q", "k", "v", object(), comm="p2p") == ("ran", "q")
    assert attention("q", "k", "v", object()) == ("ran", "q")
    assert attention("q", "k", "v", object()) == ("ran", "q")  # not sampled: not inspected
    assert state.errors[CP_ATTN_SITE]["count"] == 2
    assert "AttributeError" in state.errors[CP_ATTN_SITE]["first"]
    assert state.sites[CP_ATTN_SITE].calls == 3


def test_the_record_is_written_at_once_then_at_most_every_interval(tmp_path: Path) -> None:
    from runners.profile.probe.record import CallFacts, ProbeState

    state = ProbeState(rank=0, policy=SamplingPolicy(), out_dir=tmp_path, dump_interval_s=3600)
    site = state.site("s")
    path = tmp_path / "probe_rank0.json"

    def sample(qkv_format: str) -> Path | None:
        site.tick()
        site.record({"qkv_format": qkv_format}, CallFacts(cu_seqlens=[0, 8], local_tokens=8))
        return state.maybe_dump()

    assert sample("thd") == path  # the first sampled call: written (a crash later keeps it)
    assert sample("thd") is None  # same signature inside the interval: not rewritten
    assert json.loads(path.read_text())["sites"]["s"]["sampled_calls"] == 1
    assert sample("bshd") == path  # a new signature: written at once
    state.dump_interval_s = 0
    assert sample("bshd") == path  # the interval passed
    record = json.loads(path.read_text())
    assert record["sites"]["s"]["sampled_calls"] == 4
    assert record["dump_ms"] >= 0 and state.dump_ns > 0


class _TE220DotProductAttention:
    """TE 2.20.2's ``DotProductAttention.forward`` signature (the arguments the probe reads, in
    TE's order), for the wrapper on CPU where TE is not installed; the real one ran on the H200
    (``tests/data/te-2.20.2-h200-profile``)."""

    qkv_format = "thd"
    attn_mask_type = "padding_causal"
    cp_group = None

    def forward(
        self, query_layer: Any = None, key_layer: Any = None, value_layer: Any = None,
        attention_mask: Any = None, qkv_format: str | None = None, cu_seqlens_q: Any = None,
        cu_seqlens_kv: Any = None, cu_seqlens_q_padded: Any = None,
        cu_seqlens_kv_padded: Any = None, pad_between_seqs: bool | None = None,
        qkv_layer: Any = None,
    ) -> str:
        return "attended"


def test_dpa_wrapper_reads_te_2_20s_packed_qkv_layer(tmp_path: Path) -> None:
    import torch

    from runners.profile.probe.record import ProbeState
    from runners.profile.probe.wrappers import DPA_SITE, _wrap_dpa_forward

    state = ProbeState(rank=0, policy=SamplingPolicy(first=2, every=0), out_dir=tmp_path)
    forward = _wrap_dpa_forward(state, _TE220DotProductAttention.forward)
    cu = torch.tensor([0, 1008, 1712], dtype=torch.int32)
    qkv = torch.zeros(1712, 3, 2, 8)
    for _ in range(3):  # TE's MHA passes the packed tensor and leaves query_layer None
        assert forward(_TE220DotProductAttention(), qkv_format="thd", cu_seqlens_q=cu,
                       cu_seqlens_kv=cu, cu_seqlens_q_padded=cu.clone(),
                       cu_seqlens_kv_padded=cu.clone(), qkv_layer=qkv) == "attended"
    assert state.errors == {}
    (sig,) = state.sites[DPA_SITE].to_json()["signatures"]
    assert state.sites[DPA_SITE].calls == 3 and sig["sampled_calls"] == 2
    assert sig["same_object"] == {"false": 2} and sig["value_equal"] == {"true": 2}
    assert sig["local_tokens_aligned"] == {"8": 2, "16": 2, "128": 0}  # 1712 rows = tokens
    assert state.host_copy_ns > 0
    assert json.loads((tmp_path / "probe_rank0.json").read_text())["sites"][DPA_SITE]["calls"] >= 1
