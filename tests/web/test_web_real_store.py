"""The pages over the real store: a real bundle uploaded, analysed by the real worker, read back.

What the fake-store page tests cannot show: the history page's spread bars come from metrics the
analysis really writes (p10/p90), the run list filters and sorts in SQL (the same list the API
serves), and one upload -> analysis -> page reads the archive once and parses the manifest file
once (the worker, another process, rebuilds the typed manifest once from the stored JSON).
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from stored_runs import drain_worker

import analyzers.bundle
import analyzers.manifest
from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings

BUNDLE = Path(__file__).resolve().parents[2] / "demo" / "bundles"
SMALL = BUNDLE / "allgather-bundled-dcs-vs-nlb-h200x2.tar.gz"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    counts = {"archive_reads": 0, "manifest_parses": 0}
    patch = pytest.MonkeyPatch()
    open_tar, parse = tarfile.open, analyzers.manifest.parse_manifest

    def counted_open(*args: Any, **kwargs: Any) -> Any:
        counts["archive_reads"] += 1
        return open_tar(*args, **kwargs)

    def counted_parse(*args: Any, **kwargs: Any) -> Any:
        counts["manifest_parses"] += 1
        return parse(*args, **kwargs)

    patch.setattr(analyzers.bundle.tarfile, "open", counted_open)
    patch.setattr(analyzers.bundle, "parse_manifest", counted_parse)
    patch.setattr(analyzers.manifest, "parse_manifest", counted_parse)
    settings = Settings(data_dir=tmp_path_factory.mktemp("real"), ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with TestClient(app) as client:
        resp = client.post(
            "/api/v1/uploads/bundles",
            files={"bundle": (SMALL.name, SMALL.read_bytes())},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resp.status_code == 201, resp.text
        after_upload = dict(counts)
        drain_worker(settings)
        after_analysis = dict(counts)
        run_id = resp.json()["run_id"]
        yield {
            "client": client,
            "run_id": run_id,
            "counts": counts,
            "after_upload": after_upload,
            "after_analysis": after_analysis,
        }
    patch.undo()


def test_each_archive_read_once_and_each_manifest_file_parsed_once(real: dict[str, Any]) -> None:
    client, run_id = real["client"], real["run_id"]
    assert real["after_upload"] == {"archive_reads": 1, "manifest_parses": 1}
    # the worker reads blobs, never the archive; it rebuilds the typed manifest once, in the
    # analysis child process when it uses one (not counted here), else in this process
    assert real["after_analysis"]["archive_reads"] == 1
    assert real["after_analysis"]["manifest_parses"] in (1, 2)
    for page in (f"/runs/{run_id}", f"/runs/{run_id}.json", "/runs", "/runs.json", "/history"):
        assert client.get(page).status_code == 200, page
    assert real["counts"] == real["after_analysis"], "pages parse no manifest, read no archive"


def test_history_spread_bars_come_from_written_metrics(real: dict[str, Any]) -> None:
    client, run_id = real["client"], real["run_id"]
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "analysed", run
    page = client.get(
        "/history.json", params={"config_key": run["config_key"], "metric": "iteration_median_ms"}
    ).json()
    assert [row["point"]["run_id"] for row in page["points"]] == [run_id]
    (trace,) = page["figures"]["history"]["data"][-1:]
    spread = trace["error_y"]
    assert spread["array"][0] > 0 and spread["arrayminus"][0] > 0, spread


def test_run_list_filters_in_sql_like_the_api(real: dict[str, Any]) -> None:
    client, run_id = real["client"], real["run_id"]
    api = client.get("/api/v1/runs").json()["items"]
    (row,) = client.get("/runs.json").json()["runs"]
    assert row["id"] == api[0]["id"] == run_id
    assert row["implementation"] == api[0]["implementation"] == "bundled"
    assert row["verdict"] == api[0]["verdict"] in ("clean", "findings")
    day = row["created_at"][:10]
    for params, expected in [
        ({"implementation": "bundled"}, [run_id]),
        ({"implementation": "te"}, []),
        ({"verdict": row["verdict"]}, [run_id]),
        ({"verdict": "failed"}, []),
        ({"date_from": day, "date_to": day}, [run_id]),
        ({"date_from": "2999-01-01"}, []),
    ]:
        page = client.get("/runs.json", params=params).json()
        assert [r["id"] for r in page["runs"]] == expected, params
        assert page["total"] == len(expected)
