"""Runs in a real store: bundles uploaded through the real API, analysed by the real worker.

The fixture steps the real-store page tests share (the pages must show what the worker wrote,
so none of them fakes either side).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fastapi.testclient import TestClient

from tests.service.service_factories import drain_worker  # the one drain loop of the tests


def upload_bundles(client: TestClient, token: str, bundles: Mapping[str, Path]) -> dict[str, int]:
    """Upload each bundle as a runner; {key: run id}."""
    ids = {}
    for key, bundle in bundles.items():
        resp = client.post(
            "/api/v1/uploads/bundles",
            files={"bundle": (bundle.name, bundle.read_bytes())},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resp.status_code == 201, resp.text
        ids[key] = resp.json()["run_id"]
    return ids


def assert_analysed(client: TestClient, ids: Mapping[str, int]) -> None:
    for run_id in ids.values():
        assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "analysed"


__all__ = ["assert_analysed", "drain_worker", "upload_bundles"]
