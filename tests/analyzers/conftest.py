"""Fixtures for the analyzer tests: parsed real traces (session-scoped, read once)."""

from __future__ import annotations

import sys
from pathlib import Path

# ``tests.analyzers.factories`` is imported by package path so it cannot collide with another
# test directory's helper module of the same name.
_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import pytest  # noqa: E402
from testkit import DATA_DIR, REFERENCE_WORKLOAD  # noqa: E402

from analyzers.manifest import RunManifest, parse_manifest  # noqa: E402
from analyzers.pipeline import Analysis, run_analysis  # noqa: E402

TE_DIR = DATA_DIR / "te-2.20.2-h200x2"
KINETO_3ARMS = [TE_DIR / "kineto_3arms_rank0.json.gz", TE_DIR / "kineto_3arms_rank1.json.gz"]
NSYS_3ARMS = TE_DIR / "nsys_3arms.sqlite.gz"
EQUAL_CU = [0, 8192, 12288, 14336, 16384]
WORKLOAD = dict(REFERENCE_WORKLOAD)


def te_manifest(
    prefix: str, cu_padded: list[int] | None = None, steps_per_window: int | None = None
) -> RunManifest:
    """The 3-arm run as README describes it; ``cu_padded`` replaces the padded values."""
    padded = cu_padded or EQUAL_CU
    arms = [
        ("auto_clone", False, None),
        ("explicit_false", False, False),
        ("auto_same", True, None),
    ]
    return parse_manifest(
        {
            "workload": WORKLOAD,
            "variants": [
                {
                    "name": name,
                    "window": f"{prefix}:{name}",
                    "facts": {
                        "cu_seqlens": EQUAL_CU,
                        "cu_seqlens_padded": EQUAL_CU if same else padded,
                        "padded_is_same_object": same,
                        "pad_between_seqs": pad,
                    },
                    "steps_per_window": steps_per_window,
                }
                for name, same, pad in arms
            ],
        }
    )


@pytest.fixture(scope="session")
def nsys_3arms() -> Analysis:
    # Each nsys_arm:<name> range holds the arm's last three steps (tests/data/README.md).
    return run_analysis(NSYS_3ARMS, manifest=te_manifest("nsys_arm", steps_per_window=3))


@pytest.fixture(scope="session")
def kineto_3arms() -> Analysis:
    return run_analysis(KINETO_3ARMS, manifest=te_manifest("arm"))
