"""The workload job queue runners pull from: its statements live in ``service.storage.jobs``
(one place with SQL per table, on either backend); this name is kept for its callers."""

from service.storage.jobs import (
    MAX_FREE_RELEASES,
    batch_jobs,
    claim_job,
    delete_job,
    finish_job,
    heartbeat_job,
    release_job,
    submit_checkout_job,
    submit_job,
)

__all__ = [
    "MAX_FREE_RELEASES", "batch_jobs", "claim_job", "delete_job", "finish_job",
    "heartbeat_job", "release_job", "submit_checkout_job", "submit_job",
]  # fmt: skip
