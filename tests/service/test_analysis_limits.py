"""Each analysis runs in a child process under a time and a memory limit; past either, the run
fails with the reason. A report that does not load back is a failed analysis, never stored."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from fault_support import record
from service_factories import drain_worker, kineto_bundle

from analyzers.report import AnalysisReport
from service.analysis_exec import AnalysisFailed, validate_report


def _analyse(
    app_env: dict[str, Any], client: TestClient, runner: dict[str, str], salt: str, **limits: Any
) -> dict[str, Any]:
    resp = client.post(
        "/api/v1/uploads/bundles",
        files={"bundle": ("b.tar.gz", kineto_bundle(salt=salt))},
        headers=runner,
    )
    assert resp.status_code == 201, resp.text
    settings = app_env["app"].state.settings.model_copy(update=limits)
    drain_worker(settings)
    return client.get(f"/api/v1/runs/{resp.json()['run_id']}").json()  # type: ignore[no-any-return]


def test_analysis_past_its_time_limit_fails_with_the_reason(
    app_env: dict[str, Any], client: TestClient, runner: dict[str, str]
) -> None:
    run = _analyse(app_env, client, runner, "time", analysis_time_limit_s=0.2)
    assert run["status"] == "failed"
    assert "time limit of 0.2 s" in run["error"]
    record(
        "an analysis that runs past `CPTRACE_ANALYSIS_TIME_LIMIT_S`",
        "the run fails with the reason",
        f"failed: '{run['error']}'",
    )


def test_analysis_past_its_memory_limit_fails_with_the_reason(
    app_env: dict[str, Any], client: TestClient, runner: dict[str, str]
) -> None:
    run = _analyse(app_env, client, runner, "memory", analysis_memory_limit_bytes=200 * 1024 * 1024)
    assert run["status"] == "failed"
    assert "memory" in run["error"]
    record(
        "an analysis that needs more than `CPTRACE_ANALYSIS_MEMORY_LIMIT_BYTES`",
        "the run fails with the reason",
        f"failed: '{run['error']}'",
    )


def test_analysis_within_its_limits_is_stored(
    app_env: dict[str, Any], client: TestClient, runner: dict[str, str]
) -> None:
    run = _analyse(app_env, client, runner, "ok")
    assert run["status"] == "analysed", run["error"]
    result = client.get(f"/api/v1/runs/{run['id']}/analysis/result")
    AnalysisReport.model_validate(result.json())


def test_a_report_that_does_not_load_back_is_refused(
    app_env: dict[str, Any], client: TestClient, runner: dict[str, str]
) -> None:
    run = _analyse(app_env, client, runner, "valid")
    text = client.get(f"/api/v1/runs/{run['id']}/analysis/result").text
    assert validate_report(text).ranks
    broken = text.replace('"ranks":[0', '"ranks":["not a rank"', 1)
    assert broken != text
    with pytest.raises(AnalysisFailed, match="does not load") as caught:
        validate_report(broken)
    assert caught.value.final
