"""A real local git repository for the loop's tests: commits with a suite file, a spec and,
when asked, the repository's own training script (``loop_train.py`` as ``train.py``) with a
command entry that runs it under ``cptrace profile``.

Pushed to a bare repository (the "GitHub" remote the fake serves contents from and the agent
fetches from, with ``uploadpack.allowAnySHA1InWant`` as GitHub allows fetching any commit).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

TRAIN_SCRIPT = Path(__file__).with_name("loop_train.py")

# The smallest CPU workload that still has profiled steps, the bundled helpers, and timed steps
# for the comment's iteration table (the e2e gate is the findings, not the noisy CPU time).
SMOKE_SPEC: dict[str, Any] = {
    "name": "loop-smoke",
    "implementation": "bundled",
    "device": "cpu",
    "ranks": 2,
    "seqlens": [16, 8, 8],
    "heads": 2,
    "head_dim": 8,
    "dtype": "fp32",
    "layers": 1,
    "warmup": 1,
    "iterations": 6,
    "profilers": {"mode": "torch", "profiled_steps": 1, "torch": {"with_stack": False}},
}


# The repository's own script on two gloo ranks, profiled with --torch: one warm-up step and two
# recorded ones (optimizer.step calls), no Python stacks (the helpers are ranges).
TRAIN_ENTRY: dict[str, Any] = {
    "name": "train",
    "command": "torchrun --nproc-per-node 2 train.py --steps 4",
    "profile": {
        "torch": True,
        "torch_wait": 0,
        "torch_warmup": 1,
        "torch_active": 2,
        "with_stack": False,
        "watchdog_s": 10,
        "timeout_s": 240,
    },
}


def train_script(*, broken: bool) -> str:
    """``train.py`` at a commit: the fixed attention, or with its broken switches on."""
    text = TRAIN_SCRIPT.read_text()
    assert "\nBROKEN = False\n" in text
    return text.replace("\nBROKEN = False\n", f"\nBROKEN = {broken}\n")


class LoopRepo:
    """A work tree plus its bare remote; ``commit`` returns the new SHA."""

    def __init__(self, root: Path) -> None:
        self.work = root / "work"
        self.bare = root / "remote.git"
        subprocess.run(["git", "init", "-q", "--bare", str(self.bare)], check=True)
        self._git_bare("config", "uploadpack.allowAnySHA1InWant", "true")
        subprocess.run(["git", "init", "-q", "-b", "main", str(self.work)], check=True)

    @property
    def clone_url(self) -> str:
        return self.bare.as_uri()

    def _git_bare(self, *args: str) -> None:
        subprocess.run(["git", "--git-dir", str(self.bare), *args], check=True)

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.work), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def commit(
        self,
        message: str,
        *,
        spec: dict[str, Any],
        suite: dict[str, Any] | None = None,
        setup: str | None = None,
        train_broken: bool | None = None,
    ) -> str:
        """Commit the spec, the suite file and, with ``train_broken`` given, ``train.py`` and
        its command entry in the default suite."""
        (self.work / "bench").mkdir(exist_ok=True)
        (self.work / "bench" / "smoke.yaml").write_text(yaml.safe_dump(spec))
        entries: list[dict[str, Any]] = [{"path": "bench/smoke.yaml"}]
        if train_broken is not None:
            (self.work / "train.py").write_text(train_script(broken=train_broken))
            entries.append(TRAIN_ENTRY)
        suite_file: dict[str, Any] = {
            "suites": {
                "smoke": suite
                or {
                    "gpus": 0,
                    "specs": entries,
                    "thresholds": {
                        "threshold_pct": 5,
                        "max_launch_increase": 0,
                        "fail_on_new_findings": "info",
                    },
                }
            }
        }
        if setup is not None:
            suite_file["setup"] = setup
        (self.work / ".cptrace.yml").write_text(yaml.safe_dump(suite_file))
        self.git("add", "-A")
        self.git("commit", "-qm", message)
        return self.git("rev-parse", "HEAD")

    def push(self, *branches: str) -> None:
        self.git("push", "-q", "--force", str(self.bare), *branches)
