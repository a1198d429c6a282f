"""Which base-branch run a pull request's run is compared with.

Candidates: analysed runs tagged (manifest ``run`` block, written by ``cptrace agent``) with the
same repository, suite and spec, on the pull request's base branch, and not from a pull request;
of those, only runs on the same GPU model(s) and software versions (:data:`ENVIRONMENT_KEYS`),
because a driver or TE update moves kernel times by more than most regressions. Of those, the
run at the merge-base SHA when it was measured, else the newest one (the comment says which).

For a workload spec the suite and spec name are the loop's configuration key rather than the
workload hash (``runs.config_key``): a pull request may change its own workload (a flag in its
spec file), and that change is what is being measured, not a reason to find no baseline. A
command entry (the repository's own script under ``cptrace profile``) adds its ``entry_key``:
the same command line and profiler settings (``contracts.profile_entry.CommandEntry``), since
a different command or profiler schedule measures something else; the script's code at the
commit is what is being measured.

History (:func:`baseline_history`): the chosen baseline and the same-stack runs before it,
newest first. The publisher pools the iteration times of the last K of them (the noise of the
base comes from history, not from one run) and looks for change points in the longer series.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from service.storage import runs
from service.storage.engine import Conn

ENVIRONMENT_KEYS = (
    "gpu_models",
    "torch",
    "cuda",
    "cudnn",
    "nccl",
    "transformer_engine",
    "driver",
)
CANDIDATE_LIMIT = 200
HISTORY_LIMIT = 20
"""Base-branch runs read for change points (the last K of them are pooled)."""


@dataclass(frozen=True, slots=True)
class RunTags:
    """A run's loop tags and environment, read from its manifest."""

    run_id: int
    name: str
    commit: str | None
    branch: str | None
    repo: str | None
    suite: str | None
    spec: str | None
    pr: int | None
    environment: dict[str, Any]
    entry_key: str | None = None
    """A command entry's configuration key (command line + profiler settings); None: a spec."""

    def environment_key(self) -> tuple[str, ...]:
        return tuple(json.dumps(self.environment.get(k), sort_keys=True) for k in ENVIRONMENT_KEYS)


@dataclass(frozen=True, slots=True)
class ChosenBaseline:
    run: RunTags
    how: Literal["merge-base", "newest"]


def _tags(row: dict[str, Any]) -> RunTags:
    manifest = json.loads(row["manifest_json"] or "{}")
    run = manifest.get("run") if isinstance(manifest.get("run"), dict) else {}
    env = manifest.get("environment") if isinstance(manifest.get("environment"), dict) else {}
    pr = run.get("pr")
    return RunTags(
        run_id=int(row["id"]),
        name=str(row["name"]),
        commit=row["commit"],
        branch=row["branch"],
        repo=run.get("repo"),
        suite=run.get("suite"),
        spec=run.get("spec_name"),
        pr=int(pr) if isinstance(pr, int) else None,
        environment=env,
        entry_key=run.get("entry_key") if isinstance(run.get("entry_key"), str) else None,
    )


def run_tags(conn: Conn, run_id: int) -> RunTags | None:
    row = runs.loop_tag_row(conn, run_id=run_id)
    return None if row is None else _tags(row)


def _same_stack(conn: Conn, head: RunTags, base_ref: str) -> list[RunTags]:
    """The candidates on ``base_ref`` measured on ``head``'s GPU model and versions, newest
    first."""
    candidates = runs.loop_baseline_candidates(
        conn,
        branch=base_ref,
        exclude_run_id=head.run_id,
        repo=head.repo,
        suite=head.suite,
        spec_name=head.spec,
        entry_key=head.entry_key,
        limit=CANDIDATE_LIMIT,
    )
    key = head.environment_key()
    return [t for t in map(_tags, candidates) if t.environment_key() == key]


def choose_baseline(
    conn: Conn, head: RunTags, base_ref: str, merge_base: str | None
) -> ChosenBaseline | None:
    """The baseline run for ``head`` on ``base_ref``; None when no run qualifies."""
    same_stack = _same_stack(conn, head, base_ref)
    if not same_stack:
        return None
    if merge_base:
        for tags in same_stack:
            if tags.commit == merge_base:
                return ChosenBaseline(tags, "merge-base")
    return ChosenBaseline(same_stack[0], "newest")


def baseline_history(
    conn: Conn,
    head: RunTags,
    base_ref: str,
    chosen: ChosenBaseline,
    limit: int = HISTORY_LIMIT,
) -> list[RunTags]:
    """``chosen`` and the same-stack runs of ``base_ref`` before it, newest first (at most
    ``limit``): runs after the chosen one may hold changes the pull request does not."""
    older = [t for t in _same_stack(conn, head, base_ref) if t.run_id <= chosen.run.run_id]
    return older[:limit]
