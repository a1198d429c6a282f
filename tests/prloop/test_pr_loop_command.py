"""Suite entries that run the repository's own command under ``cptrace profile``.

The schema (typed, one-line errors naming the field), the job the planner queues, the entry's
configuration key, and the agent's command path on real processes: a job that exits non-zero,
and a two-rank torchrun job whose rank raises while the other waits in a collective (the
watchdog stops it), each failing with the failure summary and the log's tail. The success path
(profiled ``train.py`` at two commits, compared, the comment) is the end-to-end test's.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
import time
from pathlib import Path

import pytest

from contracts.profile_entry import CommandEntry
from runners.command_job import job_environment, parse_command_entry, run_command_entry
from runners.launch import LaunchError, LaunchOptions
from runners.spec import SpecError
from service.core.config import Settings
from service.github_loop.models import JobCheckout, RepoConfig
from service.github_loop.planner import (
    PlanError,
    Target,
    load_suite_file,
    plan_batches,
    queue_batches,
)
from service.main import open_database

SUITE = """
suites:
  cpu:
    gpus: 0
    specs:
      - {name: inline-smoke, implementation: bundled, device: cpu, ranks: 2, seqlens: [16, 8, 8]}
      - name: train
        command: torchrun --nproc-per-node 2 train.py --steps 30
        profile: {torch: true, torch_active: 5}
"""
TARGET = Target("octo/model", "file:///srv/git/x.git", "a" * 40, "feature", pr=3, base_sha="b" * 40)


def test_a_suite_lists_specs_and_commands_and_the_planner_queues_both(tmp_path: Path) -> None:
    suites = load_suite_file(SUITE, ".cptrace.yml")
    (plan,) = plan_batches(TARGET, suites, client=None)
    assert plan.error is None
    assert [name for name, _ in plan.specs] == ["inline-smoke", "train"]
    command = dict(plan.specs)["train"]
    assert command["kind"] == "command" and command["command"].startswith("torchrun")
    assert command["profile"]["torch"] is True and command["profile"]["torch_active"] == 5
    # The job a runner claims: its spec is the entry, its checkout the commit.
    db = open_database(Settings(data_dir=tmp_path))
    try:
        db.write(
            lambda c: queue_batches(
                c, TARGET, [plan], repo_config=RepoConfig(), max_attempts=1, delivery_id="d1"
            )
        )
        stored = db.read(
            lambda c: [
                dict(r)
                for r in c.execute("SELECT name, spec_json, checkout_json FROM jobs ORDER BY id")
            ]
        )
    finally:
        db.close()
    assert [r["name"] for r in stored] == ["inline-smoke", "train"]
    entry = parse_command_entry(json.loads(stored[1]["spec_json"]), source="job 2 spec")
    assert entry == suites.suites["cpu"].specs[1]
    checkout = JobCheckout.model_validate_json(stored[1]["checkout_json"])
    assert checkout.sha == "a" * 40 and checkout.suite == "cpu" and checkout.pr == 3


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (
            "{name: t, command: 'torchrun train.py'}",
            "suites.cpu.specs.0.profile: Field required",
        ),
        (
            "{name: t, command: 'torchrun train.py', profile: {}}",
            "suites.cpu.specs.0.profile: nothing to record: set at least one of torch, nsys or "
            "probe to true",
        ),
        (
            "{name: t, command: 'torchrun train.py', profile: {torch: true, tourch_active: 3}}",
            "suites.cpu.specs.0.profile.tourch_active: Extra inputs are not permitted",
        ),
        (
            "{name: t, command: 'python \"train.py', profile: {torch: true}}",
            "suites.cpu.specs.0.command: cannot split the command line: No closing quotation",
        ),
        (
            "{name: t, command: '  ', profile: {torch: true}}",
            "suites.cpu.specs.0.command: the command line is empty",
        ),
        (
            "{command: 'python train.py', profile: {torch: true}}",
            "suites.cpu.specs.0.name: Field required",
        ),
        (
            "{name: t, command: 'python train.py', profile: {torch: true, watchdog_s: 0}}",
            "suites.cpu.specs.0.profile.watchdog_s: Input should be greater than 0",
        ),
        (
            "{name: t, command: x, profile: {torch: true, step_function: 'not a function'}}",
            "suites.cpu.specs.0.profile.step_function: String should match pattern",
        ),
    ],
)
def test_a_bad_command_entry_is_one_line_naming_the_field(entry: str, error: str) -> None:
    text = f"suites: {{cpu: {{gpus: 0, specs: [{entry}]}}}}"
    with pytest.raises(PlanError) as caught:
        load_suite_file(text, ".cptrace.yml at abc")
    message = str(caught.value)
    assert message.startswith(f".cptrace.yml at abc: {error}"), message
    assert "\n" not in message


def test_two_entries_of_a_suite_may_not_share_a_name() -> None:
    text = """
suites:
  cpu:
    specs:
      - {name: train, implementation: bundled, ranks: 2, seqlens: [16]}
      - {name: train, command: python train.py, profile: {torch: true}}
"""
    (plan,) = plan_batches(TARGET, load_suite_file(text, "f"), client=None)
    assert plan.specs == [] and plan.error == "suite cpu: two specs or commands are named 'train'"


def test_the_configuration_key_is_the_command_and_the_profiler_settings() -> None:
    def key(command: str, **profile: object) -> str:
        raw = {"name": "t", "command": command, "profile": {"torch": True, **profile}}
        return CommandEntry.model_validate(raw).config_key()

    base = key("torchrun --nproc-per-node 2 train.py --steps 20")
    assert base == key("torchrun  --nproc-per-node 2   train.py --steps 20")  # same tokens
    assert base == key("torchrun --nproc-per-node 2 train.py --steps 20", torch_active=3)
    assert base != key("torchrun --nproc-per-node 2 train.py --steps 40")
    assert base != key("torchrun --nproc-per-node 2 train.py --steps 20", torch_active=5)
    assert base.startswith("cmd-")
    # The hang timeout changes nothing measured; a non-default timing warm-up does.
    assert base == key("torchrun --nproc-per-node 2 train.py --steps 20", hang_timeout_s=30)
    assert base != key("torchrun --nproc-per-node 2 train.py --steps 20", time_warmup=3)
    # Settings added later left the key of an entry that does not use them as it was, so its
    # runs on the base branch stay its baselines: the key before they existed, recomputed.
    entry = _entry("torchrun --nproc-per-node 2 train.py --steps 20")
    before = entry.profile.model_dump(mode="json", exclude={"hang_timeout_s", "time_warmup"})
    canonical = json.dumps({"argv": entry.argv, "profile": before}, sort_keys=True,
                           separators=(",", ":"))
    assert base == "cmd-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def test_a_job_spec_that_is_a_broken_command_entry_fails_with_the_field() -> None:
    with pytest.raises(SpecError, match=r"job 4 spec: profile.torch_wait: Input should be"):
        parse_command_entry(
            {"kind": "command", "name": "t", "command": "x", "profile": {"torch": True,
                                                                          "torch_wait": -1}},
            source="job 4 spec",
        )  # fmt: skip


def test_the_command_runs_without_the_runner_credentials(monkeypatch) -> None:
    monkeypatch.setenv("CPTRACE_TOKEN", "cpt_secret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    env = job_environment()
    assert "CPTRACE_TOKEN" not in env and "GITHUB_TOKEN" not in env
    assert env["PATH"].split(":")[0].endswith("bin")  # our interpreter's torchrun first


def _entry(command: str, **profile: object) -> CommandEntry:
    return CommandEntry.model_validate(
        {"name": "train", "command": command, "profile": {"torch": True, **profile}}
    )


def test_a_command_that_exits_non_zero_fails_with_its_log_tail(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "train.py").write_text(
        "import sys\nprint('loading data from ./shards')\nsys.exit(3)\n"
    )
    with pytest.raises(LaunchError) as caught:
        run_command_entry(_entry("python train.py"), workspace, tmp_path / "out", LaunchOptions())
    assert str(caught.value).startswith("command 'train' failed: exit status 3")
    assert "loading data from ./shards" in caught.value.log_tail  # ran in the workspace
    assert caught.value.bundle == tmp_path / "out"  # the failure record stays with the logs


@pytest.mark.slow
def test_a_rank_that_raises_while_the_other_waits_is_stopped_by_the_watchdog(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "train.py").write_text(
        textwrap.dedent(
            """
            import time
            import torch
            import torch.distributed as dist

            dist.init_process_group("gloo")
            if dist.get_rank() == 1:
                raise RuntimeError("shard 7 is corrupt")
            dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1, forever
            time.sleep(600)
            """
        )
    )
    entry = _entry("torchrun --nproc-per-node 2 train.py", watchdog_s=1, timeout_s=120)
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        run_command_entry(entry, workspace, tmp_path / "out", LaunchOptions())
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "rank 1 raised RuntimeError" in message and "shard 7 is corrupt" in message
    # Rank 0 never returns from all_reduce by itself. Whichever stops it first, the watchdog
    # (1 s after the failure) or torchrun tearing the group down when rank 1 exits (a race on
    # a quiet machine), the job ends long before its 120 s timeout; the message names the
    # watchdog when it was the watchdog.
    assert elapsed < 60, message
    assert "ran over its timeout" not in message
    if "the launcher stopped the job" in message:
        assert "the launcher stopped the job 1.0 s after the first failure" in message
    assert "shard 7 is corrupt" in caught.value.log_tail
