"""A Kineto file that does not say its rank gives the same report as the file that does.

Issue 25, defect 1: without ``distributedInfo`` the rank was assumed (or given with ``--rank``)
for the CPU tables only, so the ``gpu_user_annotation`` rows kept rank -1 and every step was
measured over its CPU ``ProfilerStep`` range instead of its GPU annotation. Every real Kineto
file in ``tests/data`` (and, with ``CPTRACE_SHARED_TRACES`` set, that directory) is read as
captured and again with ``distributedInfo`` removed (or added, for a file that had none).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from analyzers.pipeline import run_analysis

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

ROOT = Path(__file__).resolve().parents[2]


def _kineto_files() -> list[Path]:
    bases = [ROOT / "tests" / "data"]
    shared = os.environ.get("CPTRACE_SHARED_TRACES")
    if shared:
        bases.append(Path(shared))
    seen: dict[bytes, Path] = {}
    for base in bases:
        for path in sorted(base.rglob("*.json.gz")):
            if path.name.startswith(("manifest", "report")):
                continue
            seen.setdefault(path.read_bytes(), path)
    return list(seen.values())


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The report minus what names the file, says where its rank came from, or only
    ``distributedInfo`` can say (the world size)."""
    for key in ("sources", "notes"):
        report.pop(key)
    report["environment"].pop("world_size")
    return report


@pytest.mark.parametrize("path", _kineto_files(), ids=lambda p: p.name)
def test_rankless_kineto_file_reports_as_the_ranked_one(path: Path, tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    info = doc.pop("distributedInfo", None)
    rank = info["rank"] if info else 0
    rankless = tmp_path / "profile.json"
    rankless.write_text(json.dumps(doc))
    ranked = tmp_path / "profile_ranked.json"
    ranked.write_text(json.dumps({**doc, "distributedInfo": info or {"rank": 0}}))

    want = run_analysis(ranked).report
    got = run_analysis(rankless, rank=rank if rank else None).report
    assert {w.basis for w in got.window_timelines} == {w.basis for w in want.window_timelines}
    assert _comparable(got.model_dump(mode="json")) == _comparable(want.model_dump(mode="json"))
