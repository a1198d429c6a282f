"""``cptrace analyze`` of a failed or hung run's bundle leads with the failure.

The bundles (``tests/failed_bundles.py``) carry real faulthandler dumps of waiting processes and
a real exception record; the one with traces is the checked-in CPU capture, whose analysis finds
nothing, so without the failure first the output would read like a clean run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cptrace.cli import app
from tests.failed_bundles import faulthandler_stacks, hung_without_traces, raised_with_traces


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("failed")
    stacks = faulthandler_stacks(tmp)
    return {"raised": raised_with_traces(tmp, stacks), "hung": hung_without_traces(tmp, stacks)}


def test_a_run_that_raised_after_its_traces_leads_with_the_exception(
    bundles: dict[str, Path],
) -> None:
    result = CliRunner().invoke(app, ["analyze", str(bundles["raised"])])
    assert result.exit_code == 0, result.output
    first, second = result.output.splitlines()[:2]
    assert first.startswith("FAILED the job failed: rank 1 raised ValueError: packed token count")
    assert "failed_bundles.py:" in first and "in _pack_step" in first
    assert first.endswith("rank 0 was waiting in all_reduce")
    assert second.startswith("rank 0 stack: waiting at ") and second.endswith("in wait_for_peer")
    assert "[rank1] step 2 done" in result.output  # the log tail
    assert result.output.index("FAILED") < result.output.index("cptrace analysis catalog")


def test_json_of_a_failed_run_puts_the_failure_first(bundles: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["analyze", str(bundles["raised"]), "--json"])
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert next(iter(report)) == "failure"
    assert report["failure"]["exception"]["type"] == "ValueError"
    assert "wait_for_peer" in report["failure"]["stacks"]["0"]
    assert report["rank_summaries"] and report["host_time"]  # the rest of the report is there


def test_a_hung_run_names_where_each_rank_was_waiting(bundles: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["analyze", str(bundles["hung"])])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("FAILED the job failed: the job hung and the watchdog stopped it")
    assert lines[0].count("in wait_for_peer") == 2
    assert "rank 0 waiting at" in lines[0] and "rank 1 waiting at" in lines[0]
    assert sum(line.startswith("rank ") and "stack: waiting at" in line for line in lines) == 2
    as_json = CliRunner().invoke(app, ["analyze", str(bundles["hung"]), "--json"])
    payload = json.loads(as_json.stdout)
    assert payload["failure_headline"] == lines[0].removeprefix("FAILED the job failed: ")
    assert set(payload["failure"]["stacks"]) == {"0", "1"}
