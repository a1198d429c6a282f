"""The analysis memory limit defaults from the host's memory: half of MemTotal, at most 16 GiB
(issue 24, item 15: a fixed 16 GiB promised a small host more than it has)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.config import MiB, Settings, SettingsError


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


@pytest.mark.skipif(not Path("/proc/meminfo").is_file(), reason="needs /proc/meminfo")
def test_default_is_half_the_host_memory_at_most_16_gib(tmp_path: Path) -> None:
    limit = Settings(data_dir=tmp_path).analysis_memory_limit_bytes
    assert limit == min(16384 * MiB, _mem_total() // 2)
    assert limit <= _mem_total()


def test_an_explicit_limit_wins_and_is_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CPTRACE_ANALYSIS_MEMORY_LIMIT_BYTES", str(300 * MiB))
    assert Settings(data_dir=tmp_path).analysis_memory_limit_bytes == 300 * MiB
    monkeypatch.setenv("CPTRACE_ANALYSIS_MEMORY_LIMIT_BYTES", "1024")
    with pytest.raises(SettingsError, match="CPTRACE_ANALYSIS_MEMORY_LIMIT_BYTES"):
        Settings(data_dir=tmp_path)
