"""A pull request's ``.cptrace.yml`` cannot make the service store or parse a large thing: no
YAML aliases, a size cap on the file and on each job spec it becomes (issue 24, item 7)."""

from __future__ import annotations

import time

import pytest

from service.github_loop.planner import (
    MAX_JOB_SPEC_BYTES,
    MAX_SUITE_FILE_BYTES,
    PlanError,
    Target,
    load_suite_file,
    plan_batches,
)

# The 504-byte bomb of the report: nine levels of nine aliases (9^9 strings once expanded).
BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    + ["suites: {s: {specs: [*a8]}}"]
)


def test_an_alias_bomb_is_refused_at_once() -> None:
    started = time.process_time()  # CPU time: an expansion is CPU work; wall time grows with load
    with pytest.raises(PlanError, match="aliases"):
        load_suite_file(BOMB, ".cptrace.yml at abc")
    assert time.process_time() - started < 5


def test_an_oversized_suite_file_is_refused_unparsed() -> None:
    text = "suites:\n  s:\n    specs: [{name: x}]\n# " + "x" * (30 * 1024 * 1024)
    with pytest.raises(PlanError, match=f"over the {MAX_SUITE_FILE_BYTES}-byte limit"):
        load_suite_file(text, ".cptrace.yml at abc")


def test_an_oversized_job_spec_fails_its_batch() -> None:
    """Within the file cap, a spec's JSON can still be larger (quotes): the spec cap holds."""
    items = ", ".join(["ab"] * 15_000)  # 60 KB of YAML, 90 KB of JSON
    suites = load_suite_file(
        f"suites:\n  s:\n    gpus: 0\n    specs:\n      - {{name: big, notes: [{items}]}}\n",
        ".cptrace.yml",
    )
    target = Target(repo="o/r", clone_url="https://github.com/o/r.git", head_sha="a" * 40,
                    head_ref="main")  # fmt: skip
    (plan,) = plan_batches(target, suites, None)
    assert plan.specs == [] and plan.error is not None
    assert f"over the {MAX_JOB_SPEC_BYTES}-byte limit" in plan.error
