"""A clean checkout of a job's commit for ``cptrace agent``: bounded fetch, then the setup.

The pull-request loop's jobs name a repository, a commit and an optional setup command
(``checkout`` in the claim, see docs/architecture.md). The agent makes a fresh workspace per
job (never reusing a previous job's files, which a malicious or broken commit could have left
behind), fetches exactly that commit with ``--depth`` (a bounded transfer, no tags), checks it
out detached, verifies ``HEAD`` is the commit asked for, and runs the setup command there.
Every step runs under the launch's timeout and cancel event, logged, so a failure fails the job
with the log's tail.

The setup command and the workload run the pull request's code: the setup runs in the agent's
sandbox (``runners.sandbox``: its own namespaces, the host read-only, only the checkout
writable), and the runner's credentials (``CPTRACE_TOKEN``, ``GITHUB_TOKEN``, any variable named
like a secret or holding a token-shaped value) are removed from its environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.redaction import looks_secret
from runners.launch import LaunchError, run_logged
from runners.sandbox import Sandbox

_SHA = re.compile(r"^[0-9a-f]{40}$")
_URL = re.compile(r"^(?:https://|http://|ssh://|git@|file://)[^\s]+$")
SECRET_ENV = (
    "CPTRACE_TOKEN",
    "CPTRACE_TOKEN_FILE",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "CPTRACE_GITHUB_WEBHOOK_SECRET",
)
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY", re.I)


class CheckoutError(LaunchError):
    """The job's commit could not be checked out, or its setup command failed."""


@dataclass(frozen=True, slots=True)
class Checkout:
    """The claim's ``checkout`` object (``service.github_loop.models.JobCheckout``)."""

    repo: str
    clone_url: str
    sha: str
    suite: str
    ref: str | None = None
    pr: int | None = None
    base_sha: str | None = None
    setup: str | None = None
    fetch_depth: int = 1

    @classmethod
    def from_job(cls, raw: Any) -> Checkout:
        """Validate the claim's checkout; :raises CheckoutError: naming the bad field."""
        if not isinstance(raw, dict):
            raise CheckoutError("job checkout: expected an object")
        try:
            checkout = cls(
                repo=str(raw["repo"]),
                clone_url=str(raw["clone_url"]),
                sha=str(raw["sha"]),
                suite=str(raw["suite"]),
                ref=raw.get("ref"),
                pr=raw.get("pr"),
                base_sha=raw.get("base_sha"),
                setup=raw.get("setup"),
                fetch_depth=int(raw.get("fetch_depth") or 1),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckoutError(f"job checkout: missing or invalid field {exc}") from exc
        if not _SHA.match(checkout.sha):
            raise CheckoutError(f"job checkout: sha {checkout.sha!r} is not a 40-hex commit SHA")
        if not _URL.match(checkout.clone_url):
            raise CheckoutError(
                f"job checkout: clone_url {checkout.clone_url!r} is not an https/ssh/file URL"
            )
        if not 1 <= checkout.fetch_depth <= 10000:
            raise CheckoutError("job checkout: fetch_depth must be 1..10000")
        return checkout

    def run_tags(self, spec_name: str, entry_key: str | None = None) -> dict[str, Any]:
        """The manifest ``run`` fields of a run of this checkout (what the baseline search and
        the history pages filter on); ``entry_key``: a command entry's configuration key."""
        return {
            "branch": self.ref,
            "commit": self.sha,
            "repo": self.repo,
            "pr": self.pr,
            "suite": self.suite,
            "spec_name": spec_name,
            "base_sha": self.base_sha,
            "entry_key": entry_key,
        }


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the runner's credentials (what the pull request's code sees): the
    known names, any name that says secret, any value shaped like a token."""
    return {
        k: v
        for k, v in environ.items()
        if k not in SECRET_ENV and not _SECRET_NAME.search(k) and not looks_secret(v)
    }


def _git_env() -> dict[str, str]:
    env = without_secrets(os.environ)
    env["GIT_TERMINAL_PROMPT"] = "0"  # never wait for a password on a private repository
    return env


def prepare_workspace(
    checkout: Checkout,
    root: Path,
    *,
    log: Path,
    sandbox: Sandbox,
    timeout_s: float | None = 900.0,
    cancel: threading.Event | None = None,
) -> Path:
    """Fetch and check out ``checkout.sha`` into a fresh ``root``, then run the setup there,
    inside ``sandbox`` with only ``root`` writable.

    :raises CheckoutError: a git step or the setup command failed (with the log's tail).
    """
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    env = _git_env()
    git = ["git", "-C", str(root), "-c", "advice.detachedHead=false"]
    steps = [
        (["git", "init", "-q", str(root)], "git init"),
        (
            [*git, "fetch", "--quiet", "--no-tags", "--depth", str(checkout.fetch_depth),
             "--", checkout.clone_url, checkout.sha],
            f"fetching {checkout.sha[:12]} from {checkout.clone_url}",
        ),
        ([*git, "checkout", "--quiet", "--detach", "FETCH_HEAD"], "checkout"),
    ]  # fmt: skip
    for cmd, what in steps:
        try:
            run_logged(cmd, log=log, env=env, timeout=timeout_s, cancel=cancel)
        except LaunchError as exc:
            raise CheckoutError(f"{what} failed", log_tail=exc.log_tail) from exc
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, env=env, check=False
    ).stdout.strip()
    if head != checkout.sha:
        raise CheckoutError(f"checkout: HEAD is {head or '?'}, expected {checkout.sha}")
    if checkout.setup:
        try:
            run_logged(
                sandbox.wrap(["bash", "-c", checkout.setup], writable=[root], cwd=root),
                log=log,
                env=env,
                timeout=timeout_s,
                cancel=cancel,
                cwd=root,
            )
        except LaunchError as exc:
            first = str(exc).split("\n", 1)[0].rsplit(" ... ", 1)[-1]
            raise CheckoutError(f"setup command failed ({first})", log_tail=exc.log_tail) from exc
    return root
