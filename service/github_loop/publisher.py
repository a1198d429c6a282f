"""Publish finished batches: pick baselines, judge, post one comment and one commit status.

Driven by the analysis worker (:meth:`Publisher.maybe_tick` between tasks), so a comment goes
out as soon as the last run of a batch is analysed, without a person in between. A batch is
ready when every job ended and every produced run's analysis ended. A pull request's batch
that a newer push superseded is not published (its comment would overwrite the newer one).
A transient GitHub failure leaves the batch queued for the next tick; a permanent one marks it
``error`` with the reason.

What is compared with what (:meth:`Publisher._result`): the head run with the chosen baseline
(``baseline.choose_baseline``), window group by window group: a spec run with variants has one
group per arm (``arm:NAME``, each with its ABBA-timed iterations) and gets one verdict per arm;
else the single step group (or the whole trace). The time gate's base samples are the
iteration times of the last K base-branch runs (``thresholds.baseline_runs``) pooled, after
the newest change point of that history (``pr_bot.history``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx

from analyzers.compare import CompareError, default_window
from analyzers.failure import failure_headline, failure_of
from analyzers.report import AnalysisReport
from analyzers.windows import WHOLE_TRACE
from pr_bot.comment import CommentRun, comment_context
from pr_bot.deltas import host_rows_for
from pr_bot.github import GitHubClient, GitHubConfig, GitHubError, RetryPolicy, upsert_comment
from pr_bot.history import HistoryRun, iteration_samples, pool_history
from pr_bot.labels import run_label
from pr_bot.policy import StatusState, Thresholds, judge
from pr_bot.suite_comment import (
    Baseline,
    ComparedSpec,
    FailedSpec,
    SpecResult,
    UnbaselinedSpec,
    render_suite_comment,
    status_description,
    suite_state,
)
from service import jobs, store
from service.auth import now_iso
from service.github_loop.baseline import (
    ChosenBaseline,
    RunTags,
    baseline_history,
    choose_baseline,
    run_tags,
)
from service.github_loop.commit_state import post_commit_state
from service.github_loop.config import LoopSettings
from service.storage import loop as loop_rows
from service.storage.database import Database

log = logging.getLogger("cptrace.github_loop")
_RUN_DONE = ("analysed", "failed", "empty")


class Publisher:
    """Publishes ready batches through one GitHub client."""

    def __init__(
        self,
        db: Database,
        loop: LoopSettings,
        github: GitHubConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.db = db
        self.loop = loop
        self.github = github
        self._transport = transport
        self._retry = retry or loop.retry_policy()
        self._last_tick = 0.0

    @classmethod
    def from_env(cls, db: Database, loop: LoopSettings | None = None) -> Publisher | None:
        """A publisher when ``GITHUB_TOKEN`` is set; None (the loop is off) otherwise."""
        try:
            github = GitHubConfig.from_env()
        except GitHubError:
            return None
        return cls(db, loop or LoopSettings(), github)

    def maybe_tick(self) -> int:
        """:meth:`tick` at most every ``publish_interval_s``; never raises (logs instead)."""
        now = time.monotonic()
        if now - self._last_tick < self.loop.publish_interval_s:
            return 0
        self._last_tick = now
        try:
            return self.tick()
        except Exception:  # one broken batch or GitHub outage must not stop the analyses
            log.exception("publishing pull-request results failed; retrying on the next tick")
            return 0

    def tick(self) -> int:
        """Publish every ready batch; returns how many were published."""
        batches = self.db.read(loop_rows.queued_batch_rows)
        done = 0
        for batch in batches:
            if self._ready(batch):
                done += self._publish(batch)
        return done

    # -- readiness ------------------------------------------------------------------------------
    def _jobs(self, batch_id: int) -> list[dict[str, Any]]:
        return self.db.read(lambda c: jobs.batch_jobs(c, batch_id))

    def _ready(self, batch: dict[str, Any]) -> bool:
        for job in self._jobs(batch["id"]):
            if job["status"] not in ("completed", "failed"):
                return False
            if job["status"] == "completed" and job["run_id"] is not None:
                run = store.get_run(self.db, job["run_id"], include_report=False)
                if run.status not in _RUN_DONE:
                    return False
        return True

    def _superseded(self, batch: dict[str, Any]) -> bool:
        return self.db.read(
            lambda c: loop_rows.has_newer_batch(
                c, repo=batch["repo"], pr=batch["pr_number"], suite=batch["suite"],
                batch_id=batch["id"],
            )
        )  # fmt: skip

    # -- results --------------------------------------------------------------------------------
    def _link(self, path: str) -> str | None:
        return self.loop.public_url.rstrip("/") + path if self.loop.public_url else None

    def _results(self, client: GitHubClient, batch: dict[str, Any]) -> list[SpecResult]:
        job_rows = self._jobs(batch["id"])
        if batch["reason"] and not job_rows:
            return [FailedSpec(spec="(suite)", reason=batch["reason"])]
        thresholds = Thresholds.model_validate(json.loads(batch["config_json"])["thresholds"])
        merge_base = self._merge_base(client, batch)
        return [r for job in job_rows for r in self._result(job, batch, thresholds, merge_base)]

    def _merge_base(self, client: GitHubClient, batch: dict[str, Any]) -> str | None:
        if batch["pr_number"] is None or not batch["base_sha"]:
            return None
        try:
            return client.merge_base(batch["repo"], batch["base_sha"], batch["head_sha"])
        except GitHubError as exc:
            log.warning("merge base of %s: %s", batch["head_sha"][:12], exc)
            return None

    def _result(
        self,
        job: dict[str, Any],
        batch: dict[str, Any],
        thresholds: Thresholds,
        merge_base: str | None,
    ) -> list[SpecResult]:
        """One job's results: a failure, no baseline, or one comparison per window group."""
        name = str(job["name"])
        head = None if job["run_id"] is None else store.get_run(self.db, job["run_id"])
        failure = failure_of(head.manifest) if head is not None else None
        if failure is not None:  # the job failed or hung and left its bundle: say how
            return [FailedSpec(name, failure_headline(failure), job["log_tail"] or "", failure)]
        if job["status"] == "failed":
            return [FailedSpec(name, job["reason"] or "failed", job["log_tail"] or "")]
        if head is None:
            return [FailedSpec(name, "the job completed without a run")]
        if head.status != "analysed" or head.report is None:
            why = f"analysis of run #{head.id} {head.status}: {head.error or ''}"
            return [FailedSpec(name, why)]
        head_label = run_label(head.id, head.name, head.commit)
        base_ref = batch["base_ref"] or batch["head_ref"] or "main"
        tags = self.db.read(lambda c: run_tags(c, head.id))
        chosen = (
            self.db.read(lambda c: choose_baseline(c, tags, base_ref, merge_base)) if tags else None
        )
        if chosen is None or tags is None:
            return [
                UnbaselinedSpec(
                    spec=name,
                    head_name=head_label,
                    reason=(
                        f"no analysed run of this suite and spec on {base_ref} with the same GPU "
                        "model and software versions"
                    ),
                    findings=list(head.report.findings),
                    head_url=self._link(f"/runs/{head.id}"),
                )
            ]
        base = chosen.run
        base_report = store.get_report(self.db, base.run_id)
        if base_report is None:
            return [FailedSpec(name, f"run #{base.run_id} has no stored analysis")]
        history = self._history(tags, base_ref, chosen, thresholds)
        base_label = run_label(base.run_id, base.name, base.commit)
        context = comment_context(
            suite=batch["suite"],
            base=CommentRun(base.run_id, base.name, base.commit),
            head=CommentRun(head.id, head.name, head.commit, head.manifest),
            link_root=self.loop.public_url or None,
        )
        baseline = Baseline(
            run_id=base.run_id,
            label=base_label,
            how=chosen.how,
            merge_base=merge_base,
            base_ref=base_ref,
        )
        out: list[SpecResult] = []
        groups = compared_groups(base_report, head.report)
        for group in groups:
            try:
                report = store.get_comparison(
                    self.db, base.run_id, head.id, base_window=group, head_window=group
                )
            except CompareError as exc:
                out.append(FailedSpec(name, f"comparison with run #{base.run_id} failed: {exc}"))
                continue
            host_rows = host_rows_for(base_report, head.report, report)
            pooled = None
            if report.iterations is not None:
                label, source = report.base_label, report.iterations.head.source
                runs = [
                    HistoryRun(run_id, text, iteration_samples(r, label, source))
                    for run_id, text, r in history
                ]
                pooled = pool_history(
                    runs,
                    thresholds.baseline_runs,
                    min_shift_pct=thresholds.threshold_pct,
                    base_ref=base_ref,
                )
            several = pooled is not None and len(pooled.run_ids) > 1
            verdict = judge(
                report,
                thresholds,
                base_samples=pooled.samples if pooled is not None and several else None,
                host_rows=host_rows,
            )
            out.append(
                ComparedSpec(
                    spec=name,
                    report=report,
                    verdict=verdict,
                    context=context,
                    host_rows=host_rows,
                    baseline=baseline,
                    arm=group if len(groups) > 1 else None,
                    history=pooled.lines if pooled is not None else [],
                )
            )
        return out

    def _history(
        self, tags: RunTags, base_ref: str, chosen: ChosenBaseline, thresholds: Thresholds
    ) -> list[tuple[int, str, AnalysisReport]]:
        """The baseline's history (newest first) with its reports: (run id, label, report)."""
        runs = self.db.read(lambda c: baseline_history(c, tags, base_ref, chosen))
        out = []
        for t in runs:
            report = store.get_report(self.db, t.run_id)
            if report is not None:
                out.append((t.run_id, run_label(t.run_id, t.name, t.commit), report))
        return out

    # -- posting --------------------------------------------------------------------------------
    def _mark(self, batch_id: int, **fields: Any) -> None:
        self.db.write(lambda c: loop_rows.mark_batch(c, batch_id, **fields))

    def _publish(self, batch: dict[str, Any]) -> int:
        if batch["pr_number"] is not None and self._superseded(batch):
            self._mark(batch["id"], status="superseded")
            return 0
        with GitHubClient(self.github, transport=self._transport, retry=self._retry) as client:
            try:
                results = self._results(client, batch)
                state = suite_state(results)
                target = next(
                    (r.context.comparison_url for r in results if isinstance(r, ComparedSpec)),
                    None,
                ) or self._link("/runs")
                comment_url = None
                if batch["pr_number"] is not None:
                    body = render_suite_comment(
                        batch["suite"],
                        batch["head_sha"],
                        results,
                        Thresholds.model_validate(json.loads(batch["config_json"])["thresholds"]),
                        link=target,
                    )
                    marker = body.splitlines()[0]
                    posted = upsert_comment(
                        client, batch["repo"], int(batch["pr_number"]), marker, body
                    )
                    comment_url = posted.url
                post_commit_state(
                    client,
                    self.loop,
                    batch["repo"],
                    batch["head_sha"],
                    context=f"cptrace/{batch['suite']}",
                    state=state,
                    description=status_description(results),
                    target_url=target,
                )
            except GitHubError as exc:
                if exc.retryable:
                    log.warning("batch %s: GitHub unavailable, will retry: %s", batch["id"], exc)
                    return 0
                log.error("batch %s: GitHub refused: %s", batch["id"], exc)
                self._mark(batch["id"], status="error", reason=str(exc)[:2000])
                return 0
        self._mark(
            batch["id"],
            status="published",
            state=state.value,
            comment_url=comment_url,
            published_at=now_iso(),
        )
        log.info("batch %s (%s %s): %s", batch["id"], batch["repo"], batch["suite"], state.value)
        return 1


def compared_groups(base: AnalysisReport, head: AnalysisReport) -> list[str]:
    """The window groups compared: every step or arm group both reports hold (one verdict
    each), else each report's default group (its single group, or the whole trace)."""
    head_groups = head.groups or sorted({s.window for s in head.rank_summaries})
    base_groups = set(base.groups or {s.window for s in base.rank_summaries})
    shared = [g for g in head_groups if g in base_groups and g != WHOLE_TRACE]
    if shared:
        return shared
    window = default_window(head)
    return [window if window == default_window(base) else WHOLE_TRACE]


def pending_description(jobs_queued: int) -> str:
    return f"queued {jobs_queued} job(s); the result follows when they are analysed"


__all__ = ["Publisher", "StatusState", "pending_description"]
