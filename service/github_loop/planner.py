"""From a GitHub event to queued jobs: which commit, which suites, which specs.

A pull request (opened, synchronize, reopened) or a push to a tracked branch names a commit.
Its suites come from the service's per-repository config when one is set, else from the
repository's ``.cptrace.yml`` read at that very commit (so a pull request that changes its
benchmarks is measured with its own benchmarks). Spec files named by path are read at the same
commit. Each (commit, suite) becomes a *batch* whose jobs the runners check out and run.

Pull requests from forks run code nobody with write access has reviewed, on the runner hosts
and with their credentials: they wait for a maintainer's approval (docs/github.md, "Forks"), by
the approval label or the approval comment command from a user with write permission. An
approval covers the head commit it was given for; a new push needs a new approval.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from contracts.profile_entry import CommandEntry
from pr_bot.github import GitHubClient, upsert_comment
from pr_bot.policy import StatusState
from pr_bot.suite_comment import SUITE_FILE_MARKER, render_suite_file_error, suite_file_status
from service import jobs
from service.github_loop.commit_state import post_commit_state
from service.github_loop.config import LoopSettings
from service.github_loop.models import (
    SUITE_FILE,
    JobCheckout,
    RepoConfig,
    SuiteFile,
    first_error_parts,
)
from service.storage import loop as loop_rows
from service.storage.engine import Conn

PR_ACTIONS = frozenset({"opened", "synchronize", "reopened"})
HANDLED_EVENTS = frozenset({"push", "pull_request", "issue_comment"})
_SHA = re.compile(r"^[0-9a-f]{40}$")
_NULL_SHA = "0" * 40


class PlanError(ValueError):
    """The suite file or a spec file is unusable (the message says which and why)."""


class SuiteFileError(PlanError):
    """``.cptrace.yml`` is invalid: which file, which field, what is wrong and how to fix it
    (the pull request gets these in a comment and a failing status)."""

    def __init__(self, where: str, field: str, problem: str, fix: str) -> None:
        super().__init__(f"{where}: {field}: {problem}")
        self.where = where
        self.field = field
        self.problem = problem
        self.fix = fix


@dataclass(frozen=True, slots=True)
class Target:
    """One commit to measure, and where it belongs."""

    repo: str
    clone_url: str
    head_sha: str
    head_ref: str | None
    pr: int | None = None
    base_sha: str | None = None
    base_ref: str | None = None
    fork: bool = False


@dataclass(slots=True)
class Intent:
    """What an event asks for: a target to measure, or why nothing is done."""

    target: Target | None = None
    reason: str = ""
    awaiting_approval: bool = False


@dataclass(slots=True)
class BatchPlan:
    suite: str
    config: dict[str, Any]
    specs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    setup: str | None = None
    error: str | None = None


def _get(payload: Any, *path: str) -> Any:
    for key in path:
        payload = payload.get(key) if isinstance(payload, dict) else None
    return payload


def payload_text(payload: Any, *path: str) -> str | None:
    """The string at ``path`` of a delivery, or None (missing, or another type: a signed
    payload is still untrusted in shape)."""
    value = _get(payload, *path)
    return value if isinstance(value, str) else None


MAX_PR_NUMBER = 2**31 - 1


def _pr_number(value: Any, where: str) -> int:
    """A pull request number from a payload: an integer 1..2^31-1, else a ``PlanError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PR_NUMBER:
        raise PlanError(f"{where}: expected a pull request number 1..{MAX_PR_NUMBER}")
    return value


def _pr_target(repo: str, clone_url: str, pull: dict[str, Any]) -> Target:
    head_sha = str(_get(pull, "head", "sha") or "")
    if not _SHA.match(head_sha):
        raise PlanError(f"pull request: head.sha {head_sha!r} is not a 40-hex commit SHA")
    head_repo = _get(pull, "head", "repo", "full_name")
    return Target(
        repo=repo,
        clone_url=clone_url,
        head_sha=head_sha,
        head_ref=payload_text(pull, "head", "ref"),
        pr=_pr_number(_get(pull, "number"), "pull_request.number"),
        base_sha=payload_text(pull, "base", "sha"),
        base_ref=payload_text(pull, "base", "ref"),
        fork=head_repo != repo,
    )


def intent_from_event(
    event: str,
    payload: dict[str, Any],
    settings: LoopSettings,
    repo_config: RepoConfig,
    client: GitHubClient | None,
) -> Intent:
    """Read an event; permission checks and the pull request lookup go through ``client``."""
    if event not in HANDLED_EVENTS:
        return Intent(reason=f"event {event!r} is not handled")
    repo = str(_get(payload, "repository", "full_name") or "")
    clone_url = repo_config.clone_url or str(_get(payload, "repository", "clone_url") or "")
    if not repo or not clone_url:
        raise PlanError("payload: repository.full_name and repository.clone_url are required")
    action = payload_text(payload, "action")
    if event == "push":
        ref, after = str(payload.get("ref") or ""), str(payload.get("after") or "")
        branch = ref.removeprefix("refs/heads/")
        if not ref.startswith("refs/heads/") or branch not in repo_config.tracked_branches:
            return Intent(reason=f"push to {ref or '?'}: not a tracked branch")
        if payload.get("deleted") or after == _NULL_SHA or not _SHA.match(after):
            return Intent(reason=f"push to {branch}: branch deleted, nothing to measure")
        return Intent(Target(repo, clone_url, after, branch))
    if event == "pull_request":
        pull = payload.get("pull_request") or {}
        if action in PR_ACTIONS:
            target = _pr_target(repo, clone_url, pull)
            if target.fork:
                return Intent(
                    target, "fork pull request: waiting for a maintainer", awaiting_approval=True
                )
            return Intent(target)
        if action == "labeled" and _get(payload, "label", "name") == settings.approval_label:
            return _approved(repo, _get(payload, "sender", "login"), client, clone_url, pull)
        return Intent(reason=f"pull_request {action}: nothing to do")
    if event == "issue_comment":
        body = str(_get(payload, "comment", "body") or "").strip()
        is_pr = _get(payload, "issue", "pull_request") is not None
        command = _approval_command(body, settings.approval_command)
        if action != "created" or not is_pr or command is None:
            return Intent(reason="comment: not an approval command on a pull request")
        if client is None:
            raise PlanError("approving by comment needs GITHUB_TOKEN (to read the pull request)")
        number = _pr_number(_get(payload, "issue", "number"), "issue.number")
        pull = client.get_pull(repo, number)
        head = str(_get(pull, "head", "sha") or "")
        if command and not head.startswith(command):
            return Intent(
                reason=f"approval names {command[:12]}, but the head is {head[:12]}: not queued "
                "(a new push needs its own approval)"
            )
        return _approved(repo, _get(payload, "comment", "user", "login"), client, clone_url, pull)
    return Intent(reason=f"event {event!r} is not handled")


_APPROVED_SHA = re.compile(r"^[0-9a-f]{7,40}$")


def _approval_command(body: str, command: str) -> str | None:
    """The SHA an approval comment names ("" when it names none); None: not an approval.

    ``/cptrace run <sha>`` approves exactly that commit (checked against the head when the
    comment is processed); a bare ``/cptrace run`` approves the head at that moment.
    """
    first = body.splitlines()[0].strip() if body else ""
    if first == command:
        return ""
    rest = first.removeprefix(command + " ").strip().lower()
    if first.startswith(command + " ") and _APPROVED_SHA.match(rest):
        return rest
    return None


def _approved(
    repo: str, user: Any, client: GitHubClient | None, clone_url: str, pull: dict[str, Any]
) -> Intent:
    if client is None:
        raise PlanError("approvals need GITHUB_TOKEN (to check the approver's permission)")
    if not isinstance(user, str) or not client.can_write(repo, user):
        return Intent(reason=f"approval by {user!r} ignored: no write access to {repo}")
    return Intent(_pr_target(repo, clone_url, pull), f"approved by {user}")


MAX_SUITE_FILE_BYTES = 64 * 1024
"""Largest ``.cptrace.yml`` or spec file read from a repository."""
MAX_JOB_SPEC_BYTES = 64 * 1024
"""Largest job spec (as JSON) a suite entry may become."""


class NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases: a 504-byte alias bomb expands to gigabytes; suite files need none."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not accepted in suite files", event.start_mark
            )
        return super().compose_node(parent, index)


def _yaml(text: str, where: str) -> Any:
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_SUITE_FILE_BYTES:
        raise PlanError(f"{where}: {size} bytes, over the {MAX_SUITE_FILE_BYTES}-byte limit")
    try:
        return yaml.load(text, Loader=NoAliasLoader)
    except yaml.YAMLError as exc:
        raise PlanError(f"{where}: not valid YAML ({exc})") from exc


def load_suite_file(text: str, where: str) -> SuiteFile:
    """Parse ``.cptrace.yml``; :raises SuiteFileError: naming the file, the first bad field
    and its fix."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_SUITE_FILE_BYTES:
        raise SuiteFileError(
            where, "(file)", f"{size} bytes, over the {MAX_SUITE_FILE_BYTES}-byte limit",
            f"keep {SUITE_FILE} under {MAX_SUITE_FILE_BYTES} bytes (name spec files by path)",
        )  # fmt: skip
    try:
        raw = yaml.load(text, Loader=NoAliasLoader)  # no aliases: no alias bomb
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(YAML)"
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise SuiteFileError(
            where, at, f"not valid YAML: {problem}", f"fix the YAML syntax at {at}"
        ) from exc
    try:
        return SuiteFile.model_validate(raw)
    except ValidationError as exc:
        field, problem, fix = first_error_parts(exc)
        raise SuiteFileError(where, field, problem, fix) from exc


def suites_for(
    target: Target, repo_config: RepoConfig, client: GitHubClient | None
) -> SuiteFile | None:
    """The suites to run at the target commit; None when the repository has no suite file."""
    if repo_config.suites is not None:
        return repo_config.suites
    if client is None:
        raise PlanError(f"reading {SUITE_FILE} needs GITHUB_TOKEN")
    text = client.get_file(target.repo, SUITE_FILE, target.head_sha)
    if text is None:
        return None
    return load_suite_file(text, f"{SUITE_FILE} at {target.head_sha[:12]}")


def report_suite_file_error(
    client: GitHubClient, loop: LoopSettings, target: Target, error: SuiteFileError
) -> None:
    """Tell the commit and its pull request why nothing runs: a failing ``cptrace`` status,
    and (for a pull request) a comment naming the file, the field and the fix.

    :raises GitHubError: GitHub refused or was unreachable (the delivery is then retried).
    """
    if target.pr is not None:
        body = render_suite_file_error(error.where, error.field, error.problem, error.fix)
        upsert_comment(client, target.repo, target.pr, SUITE_FILE_MARKER, body)
    post_commit_state(
        client,
        loop,
        target.repo,
        target.head_sha,
        context="cptrace",
        state=StatusState.ERROR,
        description=suite_file_status(error.field, error.problem),
    )


def _add(plan: BatchPlan, suite: str, entry_name: str, spec: dict[str, Any]) -> None:
    """One job of the batch; entry names are the comment's sections and the baseline's key."""
    size = len(json.dumps(spec))
    if size > MAX_JOB_SPEC_BYTES:
        raise PlanError(
            f"suite {suite}: {entry_name[:100]!r} is {size} bytes as a job spec, over the "
            f"{MAX_JOB_SPEC_BYTES}-byte limit"
        )
    if any(entry_name == other for other, _ in plan.specs):
        raise PlanError(f"suite {suite}: two specs or commands are named {entry_name!r}")
    plan.specs.append((entry_name, spec))


def plan_batches(target: Target, suites: SuiteFile, client: GitHubClient | None) -> list[BatchPlan]:
    """One batch per suite, one job per spec or command entry (a command entry's job spec is
    the entry itself); a suite whose spec files cannot be read is a batch with an error (its
    comment says so) rather than a silent skip."""
    plans = []
    for name, suite in suites.suites.items():
        plan = BatchPlan(
            suite=name,
            config={"thresholds": suite.thresholds.model_dump(), "gpus": suite.gpus},
            setup=suite.setup if suite.setup is not None else suites.setup,
        )
        try:
            for i, ref in enumerate(suite.specs):
                if isinstance(ref, CommandEntry):  # runs in the checkout: nothing to read here
                    _add(plan, name, ref.name, ref.model_dump(mode="json"))
                    continue
                spec = ref.spec
                where = f"suite {name} spec {i + 1}"
                if ref.path is not None:
                    where = f"{ref.path} at {target.head_sha[:12]}"
                    if client is None:
                        raise PlanError(f"{where}: reading spec files needs GITHUB_TOKEN")
                    text = client.get_file(target.repo, ref.path, target.head_sha)
                    if text is None:
                        raise PlanError(f"{where}: no such file")
                    spec = _yaml(text, where)
                if not isinstance(spec, dict):
                    raise PlanError(f"{where}: expected a mapping of workload fields")
                _add(plan, name, str(spec.get("name") or f"spec{i + 1}"), spec)
        except PlanError as exc:
            plan.specs.clear()
            plan.error = str(exc)
        plans.append(plan)
    return plans


def queue_batches(
    conn: Conn,
    target: Target,
    plans: list[BatchPlan],
    *,
    repo_config: RepoConfig,
    max_attempts: int,
    delivery_id: str | None,
) -> list[int]:
    """Insert the batches and their jobs (caller holds the transaction); a batch that exists
    already for this commit and suite is left alone. Returns the new batch ids."""
    created = []
    for plan in plans:
        batch_id = loop_rows.insert_batch(
            conn, repo=target.repo, pr_number=target.pr, head_sha=target.head_sha,
            head_ref=target.head_ref, base_sha=target.base_sha, base_ref=target.base_ref,
            suite=plan.suite, config_json=json.dumps(plan.config), reason=plan.error,
            delivery_id=delivery_id,
        )  # fmt: skip
        if batch_id is None:  # this commit and suite has its batch already
            continue
        created.append(batch_id)
        if target.pr is not None:
            loop_rows.supersede_older(
                conn, repo=target.repo, pr=target.pr, suite=plan.suite, newest=batch_id
            )
        for spec_name, spec in plan.specs:
            checkout = JobCheckout(
                repo=target.repo,
                clone_url=target.clone_url,
                sha=target.head_sha,
                ref=target.head_ref,
                pr=target.pr,
                base_sha=target.base_sha,
                suite=plan.suite,
                setup=plan.setup,
                fetch_depth=repo_config.fetch_depth,
            )
            jobs.submit_checkout_job(
                conn,
                spec=spec,
                name=spec_name,
                gpus=int(plan.config["gpus"]),
                max_attempts=max_attempts,
                batch_id=batch_id,
                checkout=checkout.model_dump(),
            )
    return created
