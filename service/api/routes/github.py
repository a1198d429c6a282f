"""The pull-request loop's HTTP side: GitHub's webhook, and batches for CI-triggered runs.

``POST /api/v1/github/webhook`` (no bearer token: GitHub signs the body instead):
``pull_request`` (opened, synchronize, reopened; ``labeled`` with the approval label),
``issue_comment`` (the approval command) and ``push`` to tracked branches queue a batch of jobs
per suite and answer 202; any other event is ignored with 202; a bad or missing signature is a
401 and queues nothing; a replayed delivery id answers 200 and queues nothing.

``POST /api/v1/github/batches`` queues the same for a commit that CI names (the composite
action): an admin token, or a CI token scoped to that repository; a runner token never (it runs
jobs and nothing else). The clone URL is the service's (the repository's configured
``clone_url``, else ``https://github.com/OWNER/NAME.git``), never the request's. A CI token's
pull request must be the base repository's own (forks wait for a maintainer's approval through
the webhook) at the head GitHub reports; a commit without a pull request names a tracked branch.
``GET /api/v1/github/batches/{id}`` is how it waits for the result.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from pr_bot.github import GitHubClient, GitHubConfig, GitHubError, GitHubInputError
from service.api.deps import Credentials, DbDep, ReadAccess, TokenRole
from service.auth import Principal, Role, lookup_principal
from service.core.errors import (
    ApiError,
    BadRequest,
    Forbidden,
    NotFound,
    Unauthorized,
    UnprocessableEntity,
)
from service.github_loop import planner
from service.github_loop.body import gate_for, read_signed_body
from service.github_loop.commit_state import post_commit_state
from service.github_loop.config import LoopConfigError, LoopSettings
from service.github_loop.publisher import pending_description
from service.storage import deliveries
from service.storage import loop as loop_rows
from service.storage.database import Database, immediate

router = APIRouter(prefix="/github", tags=["github"])
log = logging.getLogger("cptrace.github_loop")


class WebhookNotConfigured(ApiError):
    """No webhook secret is configured, so no delivery can be verified."""

    status = 503


class GitHubUnavailable(ApiError):
    """GitHub could not be read (the suite file, a permission): GitHub will redeliver."""

    status = 502


def loop_settings() -> LoopSettings:
    """Read per request (a dependency, so tests and operators can change it without a
    restart)."""
    return LoopSettings()


def github_config() -> GitHubConfig | None:
    try:
        return GitHubConfig.from_env()
    except GitHubError:
        return None


LoopDep = Annotated[LoopSettings, Depends(loop_settings)]
GitHubDep = Annotated[GitHubConfig | None, Depends(github_config)]


class Batch(BaseModel):
    """One (commit, suite) of the loop and where it stands."""

    id: int
    repo: str
    pr_number: int | None
    head_sha: str
    head_ref: str | None
    base_ref: str | None
    suite: str
    status: str = Field(description="queued | published | superseded | error")
    state: str | None = Field(default=None, description="success | failure | neutral | error")
    reason: str | None
    comment_url: str | None
    created_at: str
    published_at: str | None
    jobs: list[dict[str, Any]] = Field(default_factory=list)


class WebhookAnswer(BaseModel):
    delivery: str
    outcome: str
    duplicate: bool = False
    batches: list[int] = Field(default_factory=list)


class BatchSubmit(BaseModel):
    """A commit for CI to measure: what a ``pull_request`` event would carry."""

    repo: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
    clone_url: str | None = Field(
        default=None,
        max_length=2000,
        description="optional; must equal the service's clone URL for the repository",
    )
    head_sha: str = Field(pattern=r"^[0-9a-f]{40}$")
    head_ref: str | None = Field(default=None, max_length=255)
    pr: int | None = Field(default=None, ge=1, le=2**31 - 1)
    base_sha: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")
    base_ref: str | None = Field(default=None, max_length=255)


def _queue(
    db: Database,
    loop: LoopSettings,
    config: GitHubConfig | None,
    target: planner.Target,
    delivery: str | None,
    repo_config: Any,
    client: GitHubClient | None,
) -> tuple[list[int], str]:
    """Plan (GitHub reads) and queue (one transaction); post pending statuses."""
    try:
        suites = planner.suites_for(target, repo_config, client)
    except planner.SuiteFileError as exc:
        if client is not None:  # the precise error goes to the pull request, not only here
            planner.report_suite_file_error(client, loop, target, exc)
        raise
    if suites is None:
        return [], f"no {planner.SUITE_FILE} at {target.head_sha[:12]}: nothing to run"
    plans = planner.plan_batches(target, suites, client)

    def write(conn: Any) -> list[int]:
        with immediate(conn):
            return planner.queue_batches(
                conn,
                target,
                plans,
                repo_config=repo_config,
                max_attempts=loop.job_max_attempts,
                delivery_id=delivery,
            )

    created = db.write(write)
    if client is not None:
        for plan in plans:
            if plan.error is not None:
                continue
            try:
                post_commit_state(
                    client,
                    loop,
                    target.repo,
                    target.head_sha,
                    context=f"cptrace/{plan.suite}",
                    state=None,
                    description=pending_description(len(plan.specs)),
                )
            except GitHubError as exc:  # the result status will follow anyway
                log.warning("pending status on %s: %s", target.head_sha[:12], exc)
    jobs = sum(len(p.specs) for p in plans)
    outcome = f"queued {len(created)} batch(es), {jobs} job(s) at {target.head_sha[:12]}"
    return created, outcome if created else "already queued for this commit"


def _handle_event(
    db: Database,
    loop: LoopSettings,
    config: GitHubConfig | None,
    event: str,
    payload: dict[str, Any],
    delivery: str,
) -> tuple[list[int], str]:
    repo = planner.payload_text(payload, "repository", "full_name") or ""
    client = GitHubClient(config, retry=loop.retry_policy()) if config is not None else None
    try:
        repo_config = loop.repo_config(repo)
        intent = planner.intent_from_event(event, payload, loop, repo_config, client)
        if intent.target is None:
            return [], intent.reason
        if intent.awaiting_approval:
            if client is not None:
                post_commit_state(
                    client,
                    loop,
                    intent.target.repo,
                    intent.target.head_sha,
                    context="cptrace",
                    state=None,
                    description=(
                        f"fork: waiting for a maintainer's {loop.approval_label!r} label or "
                        f"{loop.approval_command!r} comment"
                    ),
                )
            return [], intent.reason
        return _queue(db, loop, config, intent.target, delivery, repo_config, client)
    finally:
        if client is not None:
            client.close()


@router.post("/webhook", response_model=WebhookAnswer, status_code=202)
async def github_webhook(request: Request, db: DbDep, loop: LoopDep, config: GitHubDep) -> Any:
    """Verify, de-duplicate and act on one GitHub delivery."""
    if loop.webhook_secret is None:
        raise WebhookNotConfigured(
            "no webhook secret is configured (CPTRACE_GITHUB_WEBHOOK_SECRET)"
        )
    gate = gate_for(
        request, max_bodies=loop.webhook_max_bodies, max_bytes=loop.webhook_max_inflight_bytes
    )
    spool = await read_signed_body(
        request,
        secret=loop.webhook_secret.get_secret_value(),
        limit=loop.max_payload_bytes,
        gate=gate,
        deadline_s=loop.webhook_body_deadline_s,
    )
    with spool:
        body = spool.read()
    event = request.headers.get("x-github-event", "")
    delivery = request.headers.get("x-github-delivery", "")
    if not event or not delivery or len(delivery) > 100:
        raise BadRequest(
            "X-GitHub-Event and X-GitHub-Delivery (at most 100 characters) are required"
        )
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"webhook body: not valid JSON ({exc})") from exc
    if not isinstance(payload, dict):
        raise BadRequest("webhook body: expected a JSON object")
    action = payload.get("action") if isinstance(payload.get("action"), str) else None

    def claim(conn: Any) -> bool:
        with immediate(conn):
            return deliveries.record_delivery(conn, delivery, event, action)

    if not await db.awrite(claim):
        previous = db.read(lambda c: deliveries.delivery_outcome(c, delivery))
        answer = WebhookAnswer(delivery=delivery, outcome=previous or "", duplicate=True)
        return JSONResponse(answer.model_dump(), status_code=200)
    try:
        created, outcome = await run_in_threadpool(
            _handle_event, db, loop, config, event, payload, delivery
        )
    except (planner.PlanError, LoopConfigError, GitHubInputError) as exc:
        # GitHubInputError: the payload names what no GitHub request can be made for (a bad
        # OWNER/NAME): nothing was sent, and a redelivery would carry the same data
        created, outcome = [], f"not queued: {str(exc)[:300]}"
    except GitHubError as exc:
        # Forget the delivery so that GitHub's redelivery is not taken for a replay.
        await db.awrite(lambda c: deliveries.forget_delivery(c, delivery))
        raise GitHubUnavailable(f"GitHub: {exc}") from exc
    await db.awrite(lambda c: deliveries.set_outcome(c, delivery, outcome))
    code = 200 if event == "ping" else 202
    answer = WebhookAnswer(delivery=delivery, outcome=outcome, batches=created)
    return JSONResponse(answer.model_dump(), status_code=code)


async def batch_submitter(db: DbDep, credentials: Credentials, role: TokenRole) -> Principal:
    """Who may queue batches: admins, and CI tokens (their repository checked by the route)."""
    if role is None or credentials is None:
        raise Unauthorized("queueing batches needs a bearer token (an admin or a CI token)")
    principal = db.read(lambda c: lookup_principal(c, credentials.credentials))
    if principal is None:
        raise Unauthorized("the bearer token is not valid")
    if principal.role not in (Role.ADMIN, Role.CI):
        raise Forbidden(
            f"batches are queued by the webhook, an admin or a CI token; this token is "
            f"{principal.role.value}"
        )
    return principal


def _check_ci_target(
    body: BatchSubmit, principal: Principal, loop: LoopSettings, client: GitHubClient | None
) -> None:
    """A CI token's commit: its own repository; a pull request of that repository (never a
    fork's) at its current head (checked with GitHub), or a push to a tracked branch."""
    if principal.repo != body.repo:
        raise Forbidden(f"this CI token queues batches for {principal.repo}, not {body.repo}")
    if client is None:
        raise GitHubUnavailable("checking a CI token's commit needs GITHUB_TOKEN on the service")
    if body.pr is not None:
        pull = client.get_pull(body.repo, body.pr)
        head = pull.get("head") or {}
        if ((head.get("repo") or {}).get("full_name")) != body.repo:
            raise Forbidden(
                f"pull request {body.pr} comes from a fork: it runs after a maintainer's "
                f"{loop.approval_label!r} label or {loop.approval_command!r} comment"
            )
        if head.get("sha") != body.head_sha:
            raise UnprocessableEntity(
                f"head_sha {body.head_sha[:12]} is not pull request {body.pr}'s head"
            )
        return
    tracked = loop.repo_config(body.repo).tracked_branches
    if body.head_ref not in tracked:
        raise Forbidden(f"a CI token queues a pull request or a tracked branch ({tracked})")


SubmitterDep = Annotated[Principal, Depends(batch_submitter)]


@router.post("/batches", response_model=list[Batch], status_code=201)
def submit_batches(
    body: BatchSubmit, db: DbDep, loop: LoopDep, config: GitHubDep, principal: SubmitterDep
) -> list[Batch]:
    """Queue the suites of one commit (CI's trigger); answers the batches, new or existing."""
    repo_config = loop.repo_config(body.repo)
    clone_url = repo_config.clone_url or f"https://github.com/{body.repo}.git"
    if body.clone_url is not None and body.clone_url != clone_url:
        raise UnprocessableEntity(
            f"clone_url: the service fetches {body.repo} from its own configuration "
            f"({clone_url}), not from the request"
        )
    client = GitHubClient(config, retry=loop.retry_policy()) if config is not None else None
    try:
        if principal.role is Role.CI:
            _check_ci_target(body, principal, loop, client)
    except GitHubError as exc:
        raise GitHubUnavailable(f"GitHub: {exc}") from exc
    finally:
        if client is not None:
            client.close()
    target = planner.Target(
        repo=body.repo,
        clone_url=clone_url,
        head_sha=body.head_sha,
        head_ref=body.head_ref,
        pr=body.pr,
        base_sha=body.base_sha,
        base_ref=body.base_ref,
    )
    client = GitHubClient(config, retry=loop.retry_policy()) if config is not None else None
    try:
        _queue(db, loop, config, target, None, repo_config, client)
    except planner.PlanError as exc:
        raise UnprocessableEntity(str(exc)) from exc
    except GitHubError as exc:
        raise GitHubUnavailable(f"GitHub: {exc}") from exc
    finally:
        if client is not None:
            client.close()
    found = db.read(
        lambda c: loop_rows.commit_batch_ids(c, repo=body.repo, head_sha=body.head_sha, pr=body.pr)
    )
    return [read_batch(batch_id, db, None) for batch_id in found]


@router.get("/batches/{batch_id}", response_model=Batch)
def read_batch(
    batch_id: Annotated[int, Path(ge=1, le=2**63 - 1)], db: DbDep, _: ReadAccess
) -> Batch:
    """One batch with its jobs (id, name, status, run id, reason)."""
    row = db.read(lambda c: loop_rows.batch_row(c, batch_id))
    if row is None:
        raise NotFound(f"batch {batch_id} does not exist")
    job_rows = db.read(lambda c: loop_rows.batch_job_outcomes(c, batch_id))
    return Batch.model_validate({**row, "jobs": job_rows})
