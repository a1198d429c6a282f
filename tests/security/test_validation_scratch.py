"""A validation process killed at its time limit leaves nothing in ``tmp/``: the parent removes
the upload's staging folder (issue 24, item 9). A real validation pool (spawned processes)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from fastapi.testclient import TestClient
from service_factories import auth, kineto_bundle

from service.auth import Role, create_token
from service.core.config import Settings
from service.main import create_app

BIG = 300 * 1024 * 1024  # spaces: a ~300 KB gzip that the sink writes out in full


class _Spaces(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = b" " * n
        self.left -= n
        return n


def _slow_bundle(path: Path) -> Path:
    manifest = {
        "schema_version": 1, "bundle_version": 1,
        "run": {"name": "slow", "branch": "main", "commit": "abc", "created_at": "2026-01-01",
                "spec": {"name": "slow"}, "host": "t"},
        "traces": [{"path": "traces/big.json", "format": "kineto", "rank": 0,
                    "sha256": "0" * 64}],
    }  # fmt: skip
    with tarfile.open(path, mode="w:gz", compresslevel=1) as tar:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("traces/big.json")
        info.size = BIG
        tar.addfile(info, io.BufferedReader(_Spaces(BIG)))
    return path


def test_a_killed_validation_leaves_no_scratch(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", ingest_workers=1, validation_time_limit_s=60,
        max_decompressed_bytes=2 * BIG, max_stored_ratio=10_000,
    )  # fmt: skip
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    body = _slow_bundle(tmp_path / "slow.tar.gz").read_bytes()
    with TestClient(app) as client:
        warm = client.post(  # the validation process is up and has imported the readers
            "/api/v1/uploads/bundles", content=kineto_bundle(name="warm"),
            headers={**auth(token), "Content-Type": "application/gzip"},
        )  # fmt: skip
        assert warm.status_code == 201, warm.text
        app.state.validation_pool.time_limit = 0.5  # warm now: the slow upload is cut short
        answer = client.post(
            "/api/v1/uploads/bundles", content=body,
            headers={**auth(token), "Content-Type": "application/gzip"},
        )  # fmt: skip
        assert answer.status_code == 413, answer.text
        assert "time limit of 0.5 s" in answer.json()["error"]
        left = [p for p in settings.tmp_dir.rglob("*") if p.is_file()]
        assert left == [], left
        assert list(settings.tmp_dir.glob("stage-*")) == []
