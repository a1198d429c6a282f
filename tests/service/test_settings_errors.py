"""A bad ``CPTRACE_*`` value is refused with one line naming the variable, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cptrace.cli import app
from service.core.config import MiB, Settings, SettingsError


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("CPTRACE_INGEST_WORKERS", "abc", "valid integer"),
        ("CPTRACE_INGEST_WORKERS", "-1", "greater than or equal to 0"),
        ("CPTRACE_MAX_UPLOAD_BYTES", "0", "greater than or equal to 1"),
        ("CPTRACE_VALIDATION_MEMORY_LIMIT_BYTES", str(MiB), f"greater than or equal to {64 * MiB}"),
        ("CPTRACE_WORKER_POLL_S", "0", "greater than 0"),
        ("CPTRACE_CLAIM_MAX_WAIT_S", "-1", "greater than or equal to 0"),
        ("CPTRACE_PUBLIC_READ", "maybe", "valid boolean"),
    ],
)
def test_bad_value_names_the_variable(
    variable: str, value: str, words: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        Settings(data_dir=tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{variable}={value!r}: ") and words in message, message


def test_limits_that_may_be_zero(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for variable in ("CPTRACE_INGEST_WORKERS", "CPTRACE_BUSY_TIMEOUT_MS", "CPTRACE_RESTART_MAX",
                     "CPTRACE_RESTART_BACKOFF_S", "CPTRACE_HEALTH_MIN_FREE_BYTES"):  # fmt: skip
        monkeypatch.setenv(variable, "0")
    settings = Settings(data_dir=tmp_path)
    assert settings.ingest_workers == settings.restart_max == settings.busy_timeout_ms == 0


def test_serve_answers_a_bad_value_with_one_error_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        app,
        ["serve", "--port", "0", "--data-dir", str(tmp_path)],
        env={"CPTRACE_HTTP_BODY_TIMEOUT_S": "soon"},
    )
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "CPTRACE_HTTP_BODY_TIMEOUT_S='soon': Input should be a valid number" in result.output
