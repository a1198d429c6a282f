"""Service settings: one pydantic-settings class, environment prefix ``CPTRACE_``.

Every field is documented in ``docs/service.md`` (a test checks the table against this class),
so an operator can find each knob without reading code.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024
MAX_RANK = 2**31 - 1
"""Largest trace rank accepted from a form or a manifest (SQLite and the readers' int32)."""


class Settings(BaseSettings):
    """Runtime configuration of the API and the analysis worker."""

    model_config = SettingsConfigDict(env_prefix="CPTRACE_", extra="ignore")

    data_dir: Path = Field(default=Path("var"), description="Directory of the database and blobs.")
    public_read: bool = Field(
        default=True, description="Allow reads (GET) without a token; writes always need one."
    )
    max_upload_bytes: int = Field(
        default=1024 * MiB,
        ge=1,
        description="Largest accepted request body, checked while streaming.",
    )
    max_decompressed_bytes: int = Field(
        default=4096 * MiB,
        ge=1,
        description="Largest total size a gzip upload may expand to (gzip-bomb guard).",
    )
    max_bundle_members: int = Field(
        default=512, ge=1, description="Most files a run bundle may hold."
    )
    read_time_limit_ms: int = Field(
        default=2000, ge=1, description="Time limit of one read query (progress handler)."
    )
    busy_timeout_ms: int = Field(
        default=10000, ge=0, description="SQLite busy timeout for every connection."
    )
    job_lease_s: float = Field(
        default=120.0, gt=0, description="Lease a runner gets on claim; heartbeats extend it."
    )
    job_max_attempts: int = Field(
        default=3, ge=1, description="Claims a job gets before an expired lease fails it."
    )
    claim_max_wait_s: float = Field(
        default=30.0, ge=0, description="Longest long-poll a runner may ask for in a claim."
    )
    analysis_lease_s: float = Field(
        default=600.0, gt=0, description="Lease of the worker on one analysis task."
    )
    analysis_max_attempts: int = Field(
        default=2, ge=1, description="Attempts of one analysis before the run is marked failed."
    )
    worker_poll_s: float = Field(
        default=0.5, gt=0, description="How often an idle analysis worker looks for tasks."
    )
    ingest_workers: int = Field(
        default=2,
        ge=0,
        description="Processes that validate uploads concurrently, off the API's event loop "
        "(0: a thread, no limits).",
    )
    validation_memory_limit_bytes: int = Field(
        default=2048 * MiB,
        ge=64 * MiB,
        description="Address-space limit of each upload-validation process (RLIMIT_AS).",
    )
    validation_time_limit_s: float = Field(
        default=300.0, gt=0, description="Longest one upload's validation may take (then 413)."
    )
    analysis_time_limit_s: float = Field(
        default=1800.0, gt=0, description="Longest one analysis may run before the run fails."
    )
    analysis_memory_limit_bytes: int = Field(
        default=16384 * MiB,
        ge=64 * MiB,
        description="Address-space limit of the process that runs one analysis (RLIMIT_AS).",
    )
    run_worker: bool = Field(
        default=False,
        description="Start an analysis worker process with the API and supervise it "
        "(`cptrace serve` sets it unless --no-worker).",
    )
    restart_max: int = Field(
        default=5,
        ge=0,
        description="Restarts of a supervised process within restart_window_s before the "
        "server gives up and reports itself unhealthy.",
    )
    restart_window_s: float = Field(
        default=300.0, gt=0, description="Window over which restart_max is counted."
    )
    restart_backoff_s: float = Field(
        default=1.0,
        ge=0,
        description="Delay before the first restart; doubles each time (max 30 s).",
    )
    worker_heartbeat_s: float = Field(
        default=2.0, gt=0, description="How often an analysis worker records that it is alive."
    )
    health_worker_stale_s: float = Field(
        default=30.0, gt=0, description="A supervised worker silent this long is reported down."
    )
    health_queue_stall_s: float = Field(
        default=900.0,
        gt=0,
        description="An analysis queued this long while no worker heartbeat is fresh is "
        "reported as a stalled queue.",
    )
    health_min_free_bytes: int = Field(
        default=256 * MiB, ge=0, description="Free disk under data_dir below which /health is 503."
    )
    http_header_timeout_s: float = Field(
        default=10.0, gt=0, description="Time a client has to send a request's headers."
    )
    http_body_timeout_s: float = Field(
        default=60.0, gt=0, description="Longest pause between two pieces of a request body."
    )
    http_keep_alive_s: int = Field(
        default=5, ge=1, description="Idle keep-alive connections are closed after this."
    )
    max_page_size: int = Field(default=500, ge=1, description="Largest `limit` of a list call.")

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # Blob links and the worker's scratch paths must not depend on the process's cwd
        # (`make run` passes the relative "var"; a relative symlink target would dangle).
        return value.expanduser().absolute()

    @property
    def db_path(self) -> Path:
        """The SQLite file."""
        return self.data_dir / "cptrace.db"

    @property
    def blob_dir(self) -> Path:
        """Root of the content-addressed blob files."""
        return self.data_dir / "blobs"

    @property
    def tmp_dir(self) -> Path:
        """Partial uploads; on the same filesystem as the blobs so a rename is atomic."""
        return self.data_dir / "tmp"
