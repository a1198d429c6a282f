"""A real local git repository for the loop's tests: commits with a suite file and a spec.

Pushed to a bare repository (the "GitHub" remote the fake serves contents from and the agent
fetches from, with ``uploadpack.allowAnySHA1InWant`` as GitHub allows fetching any commit).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

# The smallest CPU workload that still has profiled steps, the bundled helpers, and enough
# timed steps for the significance test.
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
    "iterations": 12,  # 12 vs 12 timed steps: the test's power against the machine's noise
    "profilers": {"mode": "torch", "profiled_steps": 1, "torch": {"with_stack": False}},
}


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
    ) -> str:
        (self.work / "bench").mkdir(exist_ok=True)
        (self.work / "bench" / "smoke.yaml").write_text(yaml.safe_dump(spec))
        suite_file: dict[str, Any] = {
            "suites": {
                "smoke": suite
                or {
                    "gpus": 0,
                    "specs": [{"path": "bench/smoke.yaml"}],
                    "thresholds": {
                        "min_effect_pct": 5,
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
