"""``cptrace agent``: take workload jobs from the service, run them, upload their bundles.

Protocol (docs/architecture.md, "Runner <-> service API"): long-poll ``POST /jobs/claim``; a
claimed job carries a lease that a heartbeat thread extends while the job runs. Success uploads
the bundle and calls ``complete`` with the run id; failure calls ``fail`` with the reason and
the launch log's tail. A job with a ``checkout`` (the pull-request loop) first gets a fresh
workspace with that commit and its setup command (``runners.workspace``), and its run is tagged
with the repository, branch, commit, pull request and suite. Its spec is a workload spec, or a
command entry of the suite that runs in the workspace under ``cptrace profile``
(``runners.command_job``). If the lease is lost (the service
gave the job to someone else), the launch is cancelled and nothing is reported.

Pull-request code (setup commands, command entries) runs in the agent's sandbox
(``runners.sandbox``: bubblewrap; the agent refuses to start when it cannot), never sees the
agent's token (its environment, its files, its ``/proc`` entries), and every text the agent
uploads (failure reasons, log tails, the bundle's logs and manifest) is redacted of the agent's
secrets and of token-shaped strings first (``contracts.redaction``).

SIGTERM (e.g. the node is being drained): the current job may finish within ``term_grace_s``;
after that its launch is stopped and the job is *released* back to the queue, so another runner
picks it up without using up an attempt. No new job is claimed after SIGTERM.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from contracts.profile_entry import CommandEntry
from contracts.redaction import redact_secrets
from runners.command_job import is_command_job, parse_command_entry, run_command_entry
from runners.http import ApiError, RetryPolicy, ServiceClient, with_retries
from runners.launch import LaunchError, LaunchOptions
from runners.sandbox import Sandbox, check_sandbox
from runners.spec import RunSpec, SpecError, parse_spec
from runners.upload import UploadResult
from runners.workspace import SECRET_ENV, Checkout, CheckoutError, prepare_workspace

log = logging.getLogger("cptrace.agent")
LEASE_LOST = (403, 404, 409, 410)  # 403: the job is held by another runner's token


@dataclass(slots=True, kw_only=True)
class AgentConfig:
    """Everything the agent needs besides the client."""

    runner: str = field(default_factory=socket.gethostname)
    """Name the service knows this runner by."""
    gpus: int = 1
    """GPUs this runner offers; the service only hands out jobs that fit."""
    work_dir: Path = Path("runs")
    wait_s: float = 30.0
    """Long-poll duration of one claim."""
    heartbeat_s: float = 15.0
    term_grace_s: float = 300.0
    """After SIGTERM, how long a running job may take before it is released."""
    max_jobs: int | None = None
    """Stop after this many jobs (None: until SIGTERM)."""
    max_idle_polls: int | None = None
    """Stop after this many empty claims in a row (None: never); bounds test loops."""
    keep_runs: bool = False
    """Keep bundle directories after a successful upload."""
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    sandbox: Sandbox = field(default_factory=Sandbox)
    """Where pull-request code runs; the work dir and the token file are hidden in it."""
    token_file: Path | None = None
    """The file the token was read from (hidden from jobs)."""


RunFn = Callable[[RunSpec, Path, LaunchOptions], Path]
CommandFn = Callable[[CommandEntry, Path, Path, LaunchOptions], Path]
UploadFn = Callable[[Path, ServiceClient], UploadResult]


class Agent:
    """One runner process: claim, heartbeat, run, upload, report; stop cleanly on SIGTERM."""

    def __init__(
        self,
        client: ServiceClient,
        config: AgentConfig,
        *,
        run_fn: RunFn | None = None,
        upload_fn: UploadFn | None = None,
        command_fn: CommandFn | None = None,
    ) -> None:
        from runners.launch import run_spec
        from runners.upload import upload_bundle

        self.client = client
        self.config = config
        values = (os.environ.get(k, "") for k in SECRET_ENV if k != "CPTRACE_TOKEN_FILE")
        self.secrets = (*client.secrets, *values)
        hidden = (config.work_dir, *([config.token_file] if config.token_file else []))
        self.sandbox = replace(config.sandbox, hidden=(*config.sandbox.hidden, *hidden))
        self.run_fn: RunFn = run_fn or run_spec
        self.upload_fn: UploadFn = _redacting(upload_fn or upload_bundle, self.secrets)
        self.command_fn: CommandFn = command_fn or run_command_entry
        self.stopping = threading.Event()
        self.jobs_done = 0
        self._retry = RetryPolicy(attempts=4, base_s=1.0, max_s=15.0)

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: stop claiming; finish or release the current job."""

        def handle(signum: int, _frame: Any) -> None:
            log.warning("signal %s: finishing or releasing the current job, then exiting", signum)
            self.stopping.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def check_sandbox(self) -> None:
        """Start the sandbox once; :raises SandboxError: it cannot start (fail closed)."""
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".sandbox-check-", dir=self.config.work_dir) as d:
            check_sandbox(self.sandbox, Path(d))

    def serve(self) -> int:
        """Claim and run jobs until stopped; returns the number of jobs handled.

        :raises SandboxError: the job sandbox cannot start on this host.
        """
        self.check_sandbox()
        idle = 0
        while not self.stopping.is_set():
            if self.config.max_jobs is not None and self.jobs_done >= self.config.max_jobs:
                break
            job = self.claim()
            if job is None:
                idle += 1
                if self.config.max_idle_polls is not None and idle >= self.config.max_idle_polls:
                    break
                continue
            idle = 0
            self.handle(job)
            self.jobs_done += 1
        return self.jobs_done

    def claim(self) -> dict[str, Any] | None:
        """One long poll; None when the service had no job (204)."""
        cfg = self.config
        body = {"runner": cfg.runner, "gpus": cfg.gpus, "wait_s": cfg.wait_s}
        try:
            resp = with_retries(
                lambda: self.client.post_json("/jobs/claim", body, timeout=self.config.wait_s + 30),
                self._retry,
            )
        except ApiError as exc:
            if not exc.retryable:
                raise
            log.warning("claim failed, retrying later: %s", exc)
            self.stopping.wait(self.config.heartbeat_s)
            return None
        if resp.status == 204 or not isinstance(resp.body, dict):
            return None
        return resp.body

    def handle(self, job: dict[str, Any]) -> str:
        """Run one claimed job; returns how it ended: completed, failed, released or lost."""
        job_id = job["id"]
        log.info("job %s: claimed", job_id)
        cancel = threading.Event()
        lost = threading.Event()
        done = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(job_id, done, lost, cancel), daemon=True
        )
        beat.start()
        outcome: dict[str, Any] = {}
        worker = threading.Thread(target=self._run_job, args=(job, cancel, outcome), daemon=True)
        worker.start()
        self._wait(worker, cancel)
        done.set()
        beat.join(timeout=5)
        ended = self._report(job_id, outcome, lost=lost.is_set(), released=cancel.is_set())
        log.info("job %s: %s", job_id, ended)
        return ended

    def _wait(self, worker: threading.Thread, cancel: threading.Event) -> None:
        """Wait for the job; after SIGTERM give it ``term_grace_s``, then cancel it."""
        while worker.is_alive():
            if self.stopping.wait(0.2):
                worker.join(self.config.term_grace_s)
                if worker.is_alive():
                    cancel.set()
                worker.join()
            else:
                worker.join(0.2)

    def _run_job(self, job: dict[str, Any], cancel: threading.Event, out: dict[str, Any]) -> None:
        workspace: Path | None = None
        try:
            source = f"job {job['id']} spec"
            entry: CommandEntry | None = None
            spec: RunSpec | None = None
            if is_command_job(job.get("spec")):
                entry = parse_command_entry(job["spec"], source=source)
                name = entry.name
            else:
                spec = parse_spec(job.get("spec"), source=source)
                name = spec.name
            run_dir = self.config.work_dir / f"job{job['id']}-{name}-{int(time.time())}"
            options = replace(_with_cancel(self.config.launch, cancel), sandbox=self.sandbox)
            if job.get("checkout") is not None:
                checkout = Checkout.from_job(job["checkout"])
                workspace = self.config.work_dir / f"job{job['id']}-workspace"
                prepare_workspace(
                    checkout,
                    workspace,
                    log=self.config.work_dir / f"job{job['id']}-checkout.log",
                    sandbox=self.sandbox,
                    timeout_s=self.config.launch.timeout_s or 900.0,
                    cancel=cancel,
                )
                key = entry.config_key() if entry is not None else None
                options = replace(options, run_tags=checkout.run_tags(name, key))
            if spec is not None:
                bundle = self.run_fn(spec, run_dir, options)
            elif entry is not None and workspace is not None:
                bundle = self.command_fn(entry, workspace, run_dir, options)
            else:
                raise SpecError(f"{source}: a command entry runs in a checkout; the job has none")
            if cancel.is_set():
                raise LaunchError("cancelled")
            out["upload"] = self.upload_fn(bundle, self.client)
            if not self.config.keep_runs:
                shutil.rmtree(run_dir, ignore_errors=True)
        except SpecError as exc:
            out["error"] = (f"invalid spec: {exc}", "")
        except CheckoutError as exc:
            out["error"] = (str(exc).split("\n--- log tail ---")[0], exc.log_tail)
        except LaunchError as exc:
            out["error"] = (str(exc).split("\n--- log tail ---")[0], exc.log_tail)
            if exc.bundle is not None and not cancel.is_set():
                out["failed_upload"] = self._upload_failed(exc.bundle)
        except Exception as exc:  # any failure is the job's failure, reported, not fatal
            out["error"] = (f"{type(exc).__name__}: {exc}", "")
        finally:
            if workspace is not None:  # clean: the next job never sees this one's files
                shutil.rmtree(workspace, ignore_errors=True)

    def _upload_failed(self, bundle: Path) -> UploadResult | None:
        """Upload a failed job's bundle (the failure record is the result); None if it cannot
        be sent: the job's failure is reported either way."""
        try:
            return self.upload_fn(bundle, self.client)
        except Exception as exc:  # the failure report must not depend on this upload
            log.warning("could not upload the failed job's bundle %s: %s", bundle, exc)
            return None

    def _heartbeat(
        self, job_id: int, done: threading.Event, lost: threading.Event, cancel: threading.Event
    ) -> None:
        while not done.wait(self.config.heartbeat_s):
            try:
                self.client.post_json(f"/jobs/{job_id}/heartbeat", {})
            except ApiError as exc:
                if exc.status in LEASE_LOST:
                    log.error("job %s: lease lost (%s); stopping its run", job_id, exc)
                    lost.set()
                    cancel.set()
                    return
                log.warning("job %s: heartbeat failed, will retry: %s", job_id, exc)

    def _report(self, job_id: int, outcome: dict[str, Any], *, lost: bool, released: bool) -> str:
        if lost:
            return "lost"  # the job is someone else's now; reporting would be refused
        try:
            if released:
                self._post(f"/jobs/{job_id}/release", {})
                return "released"
            if "upload" in outcome:
                self._post(f"/jobs/{job_id}/complete", {"run_id": outcome["upload"].run_id})
                return "completed"
            reason, tail = outcome.get("error", ("the job ended without a result", ""))
            reason, tail = (redact_secrets(t, self.secrets) for t in (reason, tail))
            failed: dict[str, Any] = {}
            if outcome.get("failed_upload") is not None:
                failed["run_id"] = outcome["failed_upload"].run_id
            self._post(
                f"/jobs/{job_id}/fail", {"reason": reason[:2000], "log_tail": tail, **failed}
            )
            return "failed"
        except ApiError as exc:
            log.error("job %s: could not report to the service: %s", job_id, exc)
            return "lost"

    def _post(self, path: str, body: dict[str, Any]) -> None:
        with_retries(lambda: self.client.post_json(path, body), self._retry)


def _with_cancel(options: LaunchOptions, cancel: threading.Event) -> LaunchOptions:
    return replace(options, cancel=cancel)


def redact_bundle(bundle: Path, secrets: tuple[str, ...]) -> None:
    """Rewrite the bundle's texts (``manifest.json``, ``logs/*``) without secrets, in place."""
    if not bundle.is_dir():
        return
    for path in [bundle / "manifest.json", *sorted((bundle / "logs").glob("**/*"))]:
        if not path.is_file() or path.is_symlink():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        clean = redact_secrets(text, secrets)
        if clean != text:
            path.write_text(clean, encoding="utf-8")


def _redacting(upload: UploadFn, secrets: tuple[str, ...]) -> UploadFn:
    """``upload`` of a bundle redacted first: every bundle the agent sends goes through it."""

    def send(bundle: Path, client: ServiceClient) -> UploadResult:
        redact_bundle(bundle, secrets)
        return upload(bundle, client)

    return send
