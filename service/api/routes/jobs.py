"""Workload jobs: submit a spec; runners claim (long poll), heartbeat, complete, fail, release.

Ownership: a job belongs to the token that claimed it. A runner token acts (heartbeat,
complete, fail, release) only on its own jobs, else 403, and completes a job only with a run it
uploaded itself; a runner token is bound to a runner identity (``cptrace token create --role
runner --runner NAME``, else the first name it claims under) and claims only under that name,
which no other token may use; admins may act on any job.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Query, Response

from contracts.spec import SpecError, parse_spec
from service import jobs
from service.api.deps import AdminAccess, DbDep, ReadAccess, RunnerPrincipal, SettingsDep
from service.api.schemas import (
    ClaimedJob,
    ClaimRequest,
    Job,
    JobComplete,
    JobFail,
    JobId,
    JobSubmit,
    Lease,
    Offset,
    OkBody,
)
from service.auth import Principal, bind_runner
from service.core.errors import BadRequest, NotFound, PayloadTooLarge, UnprocessableEntity
from service.github_loop.planner import MAX_JOB_SPEC_BYTES, NoAliasLoader
from service.storage import loop

router = APIRouter(prefix="/jobs", tags=["jobs"])


JobPrincipal = RunnerPrincipal


def _owner(principal: Principal) -> int | None:
    """The token id a job must have been claimed by; None for admins (any job)."""
    return None if principal.is_admin else principal.token_id


def validate_spec(body: JobSubmit) -> tuple[dict[str, Any], str | None]:
    """The spec as a JSON object, validated by the workload-spec contract (``contracts.spec``)."""
    if (body.spec is None) == (body.spec_yaml is None):
        raise BadRequest("give exactly one of 'spec' (an object) or 'spec_yaml' (YAML text)")
    raw: Any = body.spec
    if body.spec_yaml is not None:
        try:  # no aliases: a 504-byte alias bomb expands to gigabytes
            raw = yaml.load(body.spec_yaml, Loader=NoAliasLoader)
        except yaml.YAMLError as exc:
            raise BadRequest(f"spec_yaml: not valid YAML ({exc})") from exc
    if not isinstance(raw, dict):
        raise UnprocessableEntity("spec: expected a mapping of workload fields at the top level")
    size = len(json.dumps(raw, default=str))
    if size > MAX_JOB_SPEC_BYTES:  # the rule the pull-request loop's specs follow
        raise PayloadTooLarge(
            f"spec: {size} bytes as JSON, over the {MAX_JOB_SPEC_BYTES}-byte limit"
        )
    try:
        parse_spec(raw, source="spec")
    except SpecError as exc:
        raise UnprocessableEntity(str(exc)) from exc
    return raw, body.spec_yaml


def _job(row: dict[str, Any], *, full: bool = False) -> Job:
    data = {k: row.get(k) for k in Job.model_fields if k not in ("spec", "log_tail")}
    if full:
        data["spec"] = json.loads(row["spec_json"])
        data["log_tail"] = row.get("log_tail")
    return Job.model_validate(data)


@router.post("", response_model=Job, status_code=201)
def submit(body: JobSubmit, db: DbDep, settings: SettingsDep, _: AdminAccess) -> Job:
    """Queue a workload spec for the runners."""
    spec, spec_yaml = validate_spec(body)
    name = body.name or str(spec.get("name") or "job")
    job_id = db.write(
        lambda c: jobs.submit_job(
            c,
            spec=spec,
            spec_yaml=spec_yaml,
            name=name,
            gpus=body.gpus,
            max_attempts=body.max_attempts or settings.job_max_attempts,
        )
    )
    return read_job(job_id, db, None)


@router.get("", response_model=list[Job])
def list_jobs(
    db: DbDep,
    _: ReadAccess,
    status: Annotated[str | None, Query(max_length=20)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> list[Job]:
    """Jobs, newest first (without their specs and logs: those are on the job itself)."""
    found = db.read(
        lambda c: loop.list_jobs(c, batch_id=None, status=status, limit=limit, offset=offset)
    )
    return [_job(r) for r in found]


@router.get("/{job_id}", response_model=Job)
def read_job(job_id: JobId, db: DbDep, _: ReadAccess) -> Job:
    """One job with its spec and log tail."""
    row = db.read(lambda c: loop.get_job(c, job_id=job_id))
    if row is None:
        raise NotFound(f"job {job_id} does not exist")
    return _job(row, full=True)


@router.delete("/{job_id}", response_model=OkBody)
def delete_job(job_id: JobId, db: DbDep, _: AdminAccess) -> OkBody:
    """Delete a job in any state (a running job's runner loses it at its next heartbeat: 404);
    the run it produced stays."""
    db.write_tx(lambda c: jobs.delete_job(c, job_id=job_id))
    return OkBody()


@router.post(
    "/claim", response_model=ClaimedJob, responses={204: {"description": "no job within wait_s"}}
)
async def claim(
    body: ClaimRequest, db: DbDep, settings: SettingsDep, principal: JobPrincipal
) -> Any:
    """Take the oldest queued job that fits `gpus`, waiting up to `wait_s` (long poll)."""
    if not principal.is_admin:  # a runner token is bound to the first name it claims under
        db.write(lambda c: bind_runner(c, principal, body.runner))
    deadline = time.monotonic() + min(body.wait_s, settings.claim_max_wait_s)
    while True:
        claimed = await db.awrite(
            lambda c: jobs.claim_job(
                c,
                runner=body.runner,
                gpus=body.gpus,
                lease_s=settings.job_lease_s,
                token_id=principal.token_id,
            )
        )
        if claimed is not None:
            return ClaimedJob.model_validate(claimed)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Response(status_code=204)
        await asyncio.sleep(min(0.5, remaining))


@router.post("/{job_id}/heartbeat", response_model=Lease)
def heartbeat(job_id: JobId, db: DbDep, settings: SettingsDep, principal: JobPrincipal) -> Lease:
    """Extend the lease; 404/409 when it was lost (the runner must stop the job), 403 when
    another runner holds it."""
    expires = db.write(
        lambda c: jobs.heartbeat_job(
            c, job_id, lease_s=settings.job_lease_s, owner=_owner(principal)
        )
    )
    return Lease(lease_expires_at=expires)


@router.post("/{job_id}/complete", response_model=OkBody)
def complete(job_id: JobId, body: JobComplete, db: DbDep, principal: JobPrincipal) -> OkBody:
    """The job finished and produced `run_id`."""
    db.write(
        lambda c: jobs.finish_job(
            c, job_id, status="completed", run_id=body.run_id, owner=_owner(principal)
        )
    )
    return OkBody()


@router.post("/{job_id}/fail", response_model=OkBody)
def fail(job_id: JobId, body: JobFail, db: DbDep, principal: JobPrincipal) -> OkBody:
    """The job failed; the reason and log tail are kept on the job."""
    db.write(
        lambda c: jobs.finish_job(
            c,
            job_id,
            status="failed",
            run_id=body.run_id,
            reason=body.reason,
            log_tail=body.log_tail,
            owner=_owner(principal),
        )
    )
    return OkBody()


@router.post("/{job_id}/release", response_model=OkBody)
def release(job_id: JobId, db: DbDep, principal: JobPrincipal) -> OkBody:
    """Give the job back to the queue (the runner is shutting down)."""
    db.write(lambda c: jobs.release_job(c, job_id, owner=_owner(principal)))
    return OkBody()
