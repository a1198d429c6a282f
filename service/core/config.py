"""Service settings: one pydantic-settings class, environment prefix ``CPTRACE_``.

Every field is documented in ``docs/service.md`` (a test checks the table against this class),
so an operator can find each knob without reading code. Each kind of setting is declared by one
helper (``_count``, ``_size``, ``_seconds``, ``_flag``); a bad value (``CPTRACE_INGEST_WORKERS=x``)
is refused with one line naming the variable and what it expects (``SettingsError``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.validation import field_errors
from service.storage.blobs import BlobConfigError, BlobLocation, blob_location
from service.storage.engine import DatabaseUrlError, backend_of

MiB = 1024 * 1024
MAX_RANK = 2**31 - 1
"""Largest trace rank accepted from a form or a manifest (SQLite and the readers' int32)."""
ENV_PREFIX = "CPTRACE_"


class SettingsError(ValueError):
    """A setting (an environment variable or an argument) has a value it cannot take."""


def _count(default: int, description: str, *, minimum: int = 1) -> Any:
    """A whole number (a count, milliseconds) of at least ``minimum``."""
    return Field(default=default, ge=minimum, description=description)


def _size(default_mib: int, description: str, *, minimum_bytes: int = 1) -> Any:
    """A size in bytes (the default given in MiB) of at least ``minimum_bytes``."""
    return Field(default=default_mib * MiB, ge=minimum_bytes, description=description)


def _seconds(default: float, description: str, *, zero_ok: bool = False) -> Any:
    """A duration in seconds: positive (or, with ``zero_ok``, at least 0)."""
    if zero_ok:
        return Field(default=default, ge=0, description=description)
    return Field(default=default, gt=0, description=description)


ANALYSIS_MEMORY_SHARE = 0.5
"""Share of the host's memory (``MemTotal``) one analysis may address by default."""
ANALYSIS_MEMORY_CAP = 16384 * MiB
"""Most the default analysis memory limit is, however large the host."""


def host_memory_bytes() -> int:
    """The host's physical memory: ``MemTotal`` of ``/proc/meminfo`` (else ``sysconf``)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_analysis_memory_bytes() -> int:
    """Half the host's memory, at most 16 GiB, at least the 64 MiB floor of the setting: a
    small host is not promised memory it does not have (issue 24, item 15)."""
    share = int(host_memory_bytes() * ANALYSIS_MEMORY_SHARE)
    return max(64 * MiB, min(ANALYSIS_MEMORY_CAP, share))


def _flag(default: bool, description: str) -> Any:
    """On or off (``true``/``false``, ``1``/``0``, ``yes``/``no``)."""
    return Field(default=default, description=description)


class Settings(BaseSettings):
    """Runtime configuration of the API and the analysis worker."""

    model_config = SettingsConfigDict(env_prefix="CPTRACE_", extra="ignore")

    data_dir: Path = Field(default=Path("var"), description="Directory of the database and blobs.")
    blobs: str = Field(
        default="",
        description="Where blobs live: empty for `data_dir/blobs`, another folder, or "
        "`s3://bucket/prefix` (S3-compatible storage; needs the `[s3]` extra).",
    )
    s3_endpoint_url: str = Field(
        default="",
        description="Endpoint of the S3-compatible store (MinIO: `http://minio:9000`); empty: "
        "boto3's own (`AWS_ENDPOINT_URL`, else AWS). Credentials: the usual AWS variables.",
    )
    database_url: str = Field(
        default="",
        description="The database: empty for SQLite in `data_dir`, or `postgresql://...` "
        "(the API, the workers and the pull-request loop then share that server).",
    )
    public_read: bool = _flag(True, "Allow reads (GET) without a token; writes always need one.")
    max_upload_bytes: int = _size(1024, "Largest accepted request body, checked while streaming.")
    max_decompressed_bytes: int = _size(
        4096, "Largest total size a gzip upload may expand to (gzip-bomb guard)."
    )
    max_bundle_members: int = _count(512, "Most files a run bundle may hold.")
    max_stored_ratio: float = Field(
        default=100.0,
        ge=1,
        description="Most bytes a bundle may store per byte uploaded (its members as stored, "
        "after the archive's own gzip), above a floor of 64 MiB.",
    )
    max_stored_bytes_per_upload: int = _size(
        4096, "Most bytes one upload may add to the blob store (its files as stored)."
    )
    token_stored_quota_bytes: int = _size(
        65536,
        "Most bytes the runs one token uploaded may store together; past it the token's "
        "uploads are refused (413) until runs are deleted.",
    )
    read_time_limit_ms: int = _count(2000, "Time limit of one read query (progress handler).")
    busy_timeout_ms: int = _count(
        10000,
        "How long a write waits on a held lock: SQLite busy timeout of every connection,"
        " PostgreSQL lock_timeout of every write connection.",
        minimum=0,
    )
    job_lease_s: float = _seconds(120.0, "Lease a runner gets on claim; heartbeats extend it.")
    job_max_attempts: int = _count(3, "Claims a job gets before an expired lease fails it.")
    claim_max_wait_s: float = _seconds(
        30.0, "Longest long-poll a runner may ask for in a claim.", zero_ok=True
    )
    analysis_lease_s: float = _seconds(600.0, "Lease of the worker on one analysis task.")
    analysis_max_attempts: int = _count(
        2, "Attempts of one analysis before the run is marked failed."
    )
    worker_poll_s: float = _seconds(0.5, "How often an idle analysis worker looks for tasks.")
    ingest_workers: int = _count(
        2,
        "Processes that validate uploads concurrently, off the API's event loop "
        "(0: a thread, no limits).",
        minimum=0,
    )
    validation_memory_limit_bytes: int = _size(
        2048,
        "Address-space limit of each upload-validation process (RLIMIT_AS).",
        minimum_bytes=64 * MiB,
    )
    validation_time_limit_s: float = _seconds(
        300.0, "Longest one upload's validation may take (then 413)."
    )
    analysis_time_limit_s: float = _seconds(
        1800.0, "Longest one analysis may run before the run fails."
    )
    analysis_rank_workers: int = _count(
        2,
        "Rank tasks (one trace file of a run analysed per rank) one worker runs at once, "
        "each in its own process under analysis_memory_limit_bytes; other workers share the "
        "same run's rank tasks.",
    )
    analysis_per_rank_min_bytes: int = _size(
        64,
        "Stored trace bytes from which a run of several files is analysed per rank "
        "(smaller runs: one process, cheaper than starting several).",
        minimum_bytes=0,
    )
    analysis_memory_limit_bytes: int = Field(
        default_factory=default_analysis_memory_bytes,
        ge=64 * MiB,
        description="Address-space limit of the process that runs one analysis (RLIMIT_AS); "
        "by default half the host's MemTotal, at most 16 GiB.",
        json_schema_extra={"documented_default": "half of MemTotal, at most 17179869184"},
    )
    run_worker: bool = _flag(
        False,
        "Start an analysis worker process with the API and supervise it "
        "(`cptrace serve` sets it unless --no-worker).",
    )
    restart_max: int = _count(
        5,
        "Restarts of a supervised process within restart_window_s before the "
        "server gives up and reports itself unhealthy.",
        minimum=0,
    )
    restart_window_s: float = _seconds(300.0, "Window over which restart_max is counted.")
    restart_backoff_s: float = _seconds(
        1.0, "Delay before the first restart; doubles each time (max 30 s).", zero_ok=True
    )
    worker_heartbeat_s: float = _seconds(
        2.0, "How often an analysis worker records that it is alive."
    )
    health_worker_stale_s: float = _seconds(
        30.0, "A supervised worker silent this long is reported down, then restarted."
    )
    health_queue_stall_s: float = _seconds(
        900.0,
        "An analysis queued this long while no worker heartbeat is fresh is "
        "reported as a stalled queue.",
    )
    health_min_free_bytes: int = _size(
        256,
        "Free disk under data_dir below which /health is 503 and uploads are refused (507).",
        minimum_bytes=0,
    )
    http_header_timeout_s: float = _seconds(10.0, "Time a client has to send a request's headers.")
    http_body_timeout_s: float = _seconds(
        60.0, "Longest pause between two pieces of a request body."
    )
    http_body_min_bytes_per_s: int = _count(
        65536,
        "Least average rate of a request body after its first http_body_timeout_s "
        "(a trickle cannot extend the body's deadline).",
    )
    http_keep_alive_s: int = _count(5, "Idle keep-alive connections are closed after this.")
    http_max_connections: int = _count(
        512, "Most connections open at once; one more is answered 503 and closed."
    )
    max_page_size: int = _count(500, "Largest `limit` of a list call.")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(describe_settings_error(exc)) from None

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # Blob links and the worker's scratch paths must not depend on the process's cwd
        # (`make run` passes the relative "var"; a relative symlink target would dangle).
        return value.expanduser().absolute()

    @field_validator("blobs")
    @classmethod
    def _valid_blobs(cls, value: str) -> str:
        if value:
            try:
                blob_location(value)
            except BlobConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("database_url")
    @classmethod
    def _usable_database(cls, value: str) -> str:
        try:
            backend_of(value)
        except DatabaseUrlError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def blob_location(self) -> BlobLocation:
        """Where the blob store is: ``blob_dir`` by default, another folder, or S3."""
        if not self.blobs:
            return self.blob_dir
        return blob_location(self.blobs, endpoint_url=self.s3_endpoint_url or None)

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


def describe_settings_error(exc: ValidationError) -> str:
    """One line per bad setting: the variable, the value given, what it expects."""
    lines = []
    for error in field_errors(exc):
        given = error.given
        shown = f"={str(given)[:80]!r}" if isinstance(given, str | int | float) else ""
        lines.append(f"{ENV_PREFIX}{error.where('').upper()}{shown}: {error.message}")
    return "; ".join(lines)
