"""Uploads: idempotent by content against the real service; bounded retries against a fake."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from runner_fixtures import FakeService, LiveService
from testkit import free_port
from typer.testing import CliRunner

from analyzers.bundle import BundleError
from cptrace.cli import app
from runners.bundle import pack_bundle
from runners.http import RetryPolicy, ServiceClient
from runners.upload import UploadError, upload_bundle

FAST = RetryPolicy(attempts=4, base_s=0.01, max_s=0.05)


def test_upload_is_idempotent_on_the_real_service(
    live_service: LiveService, synthetic_bundle: Path, tmp_path: Path
) -> None:
    client = ServiceClient(live_service.url, live_service.tokens["runner"])
    first = upload_bundle(synthetic_bundle, client, policy=FAST)
    again = upload_bundle(synthetic_bundle, client, policy=FAST)
    archive = tmp_path / "same.tar.gz"
    pack_bundle(synthetic_bundle, archive)
    as_archive = upload_bundle(archive, client, policy=FAST)
    assert (again.run_id, again.created) == (first.run_id, False)
    assert (as_archive.run_id, as_archive.created) == (first.run_id, False)
    assert first.sha256 == as_archive.sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()


def test_wrong_token_is_final(live_service: LiveService, synthetic_bundle: Path) -> None:
    sleeps: list[float] = []
    client = ServiceClient(live_service.url, "not-a-token")
    with pytest.raises(UploadError, match="HTTP 401"):
        upload_bundle(synthetic_bundle, client, policy=FAST, sleep=sleeps.append)
    assert sleeps == [], "a 4xx must not be retried"


def test_cli_upload_reads_token_from_env(live_service: LiveService, synthetic_bundle: Path) -> None:
    result = CliRunner().invoke(
        app, ["upload", str(synthetic_bundle), "--server", live_service.url],
        env={"CPTRACE_TOKEN": live_service.tokens["runner"]},
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("run ") and "sha256" in result.output


def test_retries_5xx_with_backoff_and_a_stable_key(
    fake_service: FakeService, synthetic_bundle: Path
) -> None:
    answers = iter([(503, {"error": "busy"}), (502, None), (201, {"run_id": 7, "created": True})])
    fake_service.handler = lambda path, headers, body: next(answers)
    sleeps: list[float] = []
    result = upload_bundle(
        synthetic_bundle, ServiceClient(fake_service.url, "t"), policy=FAST, sleep=sleeps.append
    )
    assert (result.run_id, result.created) == (7, True)
    assert fake_service.paths() == ["/api/v1/uploads/bundles"] * 3
    keys = {headers["idempotency-key"] for _, headers, _ in fake_service.calls}
    assert keys == {result.sha256}
    assert all(headers["authorization"] == "Bearer t" for _, headers, _ in fake_service.calls)
    # The body is the archive itself, exactly what the key names.
    _, headers, body = fake_service.calls[0]
    assert headers["content-type"] == "application/gzip"
    assert hashlib.sha256(body).hexdigest() == result.sha256
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] * 0.9


def test_gives_up_after_the_attempts(fake_service: FakeService, synthetic_bundle: Path) -> None:
    fake_service.handler = lambda path, headers, body: (500, {"error": "boom"})
    with pytest.raises(UploadError, match="HTTP 500: boom"):
        upload_bundle(synthetic_bundle, ServiceClient(fake_service.url, "t"),
                      policy=RetryPolicy(attempts=3, base_s=0.001), sleep=lambda s: None)
    assert len(fake_service.calls) == 3


def test_client_error_is_not_retried(fake_service: FakeService, synthetic_bundle: Path) -> None:
    fake_service.handler = lambda path, headers, body: (422, {"ok": False, "error": "bad"})
    with pytest.raises(UploadError, match="HTTP 422: bad"):
        upload_bundle(synthetic_bundle, ServiceClient(fake_service.url, "t"), policy=FAST)
    assert len(fake_service.calls) == 1


def test_unreachable_server_is_retried_then_reported(synthetic_bundle: Path) -> None:
    sleeps: list[float] = []
    client = ServiceClient(f"http://127.0.0.1:{free_port()}", "t")
    with pytest.raises(UploadError, match="cannot reach"):
        upload_bundle(synthetic_bundle, client, policy=FAST, sleep=sleeps.append)
    assert len(sleeps) == FAST.attempts - 1


def test_invalid_bundle_is_never_sent(fake_service: FakeService, synthetic_bundle: Path) -> None:
    manifest = synthetic_bundle / "manifest.json"
    raw = json.loads(manifest.read_text())
    raw["traces"][0]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(raw))
    fake_service.handler = lambda path, headers, body: (201, {"run_id": 1})
    with pytest.raises(BundleError, match="does not match"):
        upload_bundle(synthetic_bundle, ServiceClient(fake_service.url, "t"), policy=FAST)
    assert fake_service.calls == []


def test_client_refuses_bad_server_or_token() -> None:
    with pytest.raises(ValueError, match="http"):
        ServiceClient("ftp://x", "t")
    with pytest.raises(ValueError, match="CPTRACE_TOKEN"):
        ServiceClient("http://127.0.0.1:1", "")
