"""Findings on traces without GPU activity: what host time alone supports, and "not observed".

Real traces only: the `cpu_smoke` run bundle (gloo on CPU, the bundled attention with TE's slow
paths switched on in the `broken` arm; tests/data/cpu-gloo), a CPU-only torch profile recorded
here with a helper that calls host-sync operators, and the real TE nsys export with its CUPTI
tables dropped. Every expected figure is computed in the test from the raw range rows (a plain
JSON walk with exact decimal times, or plain SQL), not by the analyzer's code.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import tarfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from testkit import DATA_DIR
from typer.testing import CliRunner

from cptrace.cli import app

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

RUNNER = CliRunner()
DATA = DATA_DIR
SMOKE = DATA / "cpu-gloo" / "cpu_smoke.tar.gz"
NSYS = DATA / "te-2.20.2-h200x2" / "nsys_3arms.sqlite.gz"
NOT_OBSERVED = "not observed: no GPU activity in this trace"
SYNC_OPS = {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero"}


def _analyze(*args: str) -> dict[str, Any]:
    result = RUNNER.invoke(app, ["analyze", *args, "--json"])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


def _ns(value: Decimal) -> int:
    return int(value * 1000)  # Kineto µs with at most 3 decimals: exact ns


def _spans(events: list[dict[str, Any]], name: str) -> list[tuple[int, int, int]]:
    """(start ns, end ns, tid) of the complete events called ``name``."""
    return [
        (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e["tid"])
        for e in events
        if e.get("ph") == "X" and e["name"] == name
    ]


@pytest.fixture(scope="module")
def smoke_events(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """rank -> trace events of the bundle, parsed with exact decimals."""
    root = tmp_path_factory.mktemp("smoke")
    with tarfile.open(SMOKE) as tar:
        tar.extractall(root, filter="data")
    out = {}
    for rank in (0, 1):
        path = next(root.rglob(f"kineto_rank{rank}.json.gz"))
        with gzip.open(path, "rt") as fh:
            out[rank] = json.load(fh, parse_float=Decimal)["traceEvents"]
    return out


@pytest.fixture(scope="module")
def smoke_report() -> dict[str, Any]:
    return _analyze(str(SMOKE))


def _arm_steps(events: list[dict[str, Any]], arm: str) -> list[tuple[int, int]]:
    """The ProfilerStep ranges that wrap the arm's window (how the runner records an arm)."""
    windows = _spans(events, f"arm:{arm}")
    steps = [
        (a, b)
        for e in events
        if e.get("ph") == "X" and str(e["name"]).startswith("ProfilerStep#")
        for a, b, _ in [_spans([e], e["name"])[0]]
    ]
    return sorted((a, b) for a, b in steps if any(a <= s and f <= b for s, f, _ in windows))


def _expected_host(events: list[dict[str, Any]], helper: str, arm: str) -> dict[str, float]:
    """calls/step, steady host ms/step, per call ms, first call ms, from the raw ranges."""
    calls = sorted(_spans(events, helper))
    # outermost calls only (none of these helpers nests in itself, but say so)
    assert not any(
        a < c and d <= b and t == u for a, b, t in calls for c, d, u in calls if (a, b) != (c, d)
    )
    steps = _arm_steps(events, arm)
    inside = [(a, b) for a, b, _ in calls if any(s <= a < f for s, f in steps)]
    first = calls[0][:2] if calls[0][:2] in inside else None
    first_ns = first[1] - first[0] if first else 0
    steady = sum(b - a for a, b in inside) - first_ns
    return {
        "steps": len(steps),
        "calls": round(len(inside) / len(steps), 2),
        "host": round(steady / len(steps) / 1e6, 4),
        "per_call": round(steady / max(len(inside) - (1 if first else 0), 1) / 1e6, 4),
        "first": round(first_ns / 1e6, 4),
    }


def _values(finding: dict[str, Any], rank: int) -> dict[str, Any]:
    return {e["name"]: e["value"] for e in finding["evidence"] if e["rank"] == rank}


@pytest.mark.parametrize(
    ("rule", "helper"),
    [
        ("padded-path-without-padding", "get_cu_seqlens_on_cp_rank"),
        ("zero-fill-without-padding", "cp_attention.grad_zero_fill"),
    ],
)
def test_slow_paths_of_the_broken_arm_fire_from_host_ranges(
    smoke_report: dict[str, Any],
    smoke_events: dict[int, list[dict[str, Any]]],
    rule: str,
    helper: str,
) -> None:
    assert smoke_report["host_time"]["gpu_activity"] is False
    mine = [f for f in smoke_report["findings"] if f["rule"] == rule]
    assert [(f["window"], f["severity"], f["helper"]) for f in mine] == [
        ("arm:broken", "warning", helper)
    ]
    finding = mine[0]
    assert finding["ranks"] == [0, 1]
    assert "broken_" in finding["recommendation"] and "set in this arm" in finding["recommendation"]
    for rank, events in smoke_events.items():
        want = _expected_host(events, helper, "broken")
        assert want["steps"] == 2 and want["calls"] > 0
        got = _values(finding, rank)
        basis = "per step (total / 2 steps)"
        assert got[f"calls {basis} (host ranges; {helper})"] == want["calls"]
        assert got[f"host time in the helper {basis}, first call excluded"] == pytest.approx(
            want["host"], abs=1e-4
        )
        assert got["host time per call, first call excluded"] == pytest.approx(
            want["per_call"], abs=1e-4
        )
        assert got["host time of the first call alone (compilation, warm-up)"] == (
            pytest.approx(want["first"], abs=1e-4)
        )
        assert got[f"host-sync operators inside the calls {basis}"] == 0
        # the fixed arm never calls the helper: no finding there (checked above), none in raw
        assert _expected_host(events, helper, "fixed")["calls"] == 0
    shared = {e["name"]: e["value"] for e in finding["evidence"] if e["rank"] is None}
    assert shared["CPU launch calls, GPU activities and GPU time of the helper"] == NOT_OBSERVED
    assert shared["expected saving"].startswith(NOT_OBSERVED)
    assert finding["expected_saving_ms"] is None and finding["saving_basis"] is None


def test_no_gpu_number_is_claimed_and_the_gpu_checks_say_not_observed(
    smoke_report: dict[str, Any],
) -> None:
    for finding in smoke_report["findings"]:
        for e in finding["evidence"]:
            if "GPU" in e["name"] and "not a GPU saving" not in e["name"]:
                assert e["value"] == NOT_OBSERVED, (finding["rule"], e)
    missing = [f for f in smoke_report["findings"] if f["rule"] == "gpu-not-observed"]
    assert len(missing) == 1 and missing[0]["severity"] == "info"
    checks = {e["name"].split(":")[0] for e in missing[0]["evidence"]}
    assert {"causal-imbalance", "host-sync-in-step"} <= checks
    assert all(e["value"] == NOT_OBSERVED for e in missing[0]["evidence"])


def test_cli_states_the_gpu_tables_as_not_observed() -> None:
    result = RUNNER.invoke(app, ["analyze", str(SMOKE)])
    assert result.exit_code == 0, result.output
    text = result.output
    for group in ("arm:fixed", "arm:broken", "whole trace"):
        assert (
            f"{group}: GPU timeline and where the step went: not observed: no GPU activity"
            in text
        )
    assert "GPU timeline (clipped" not in text and "where the step went\n" not in text
    assert "WARNING [padded-path-without-padding]" in text


@pytest.fixture(scope="module")
def sync_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real CPU-only profile: a batch slicer that calls .nonzero() and .item() per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    out = tmp_path_factory.mktemp("sync") / "cpu_sync.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(3):
            with record_function(f"ProfilerStep#{step}"):
                with record_function("get_batch_on_this_cp_rank"):
                    t = torch.arange(64)
                    (t % 3 == 0).nonzero()
                    int(t.sum().item())
                with record_function("cp_attention.attn_fwd_step"):
                    torch.randn(32, 32) @ torch.randn(32, 32)
    prof.export_chrome_trace(str(out))
    return out


def test_host_sync_operators_inside_a_helper_are_counted_from_the_ranges(
    sync_profile: Path,
) -> None:
    events = json.loads(sync_profile.read_text(), parse_float=Decimal)["traceEvents"]
    helper = _spans(events, "get_batch_on_this_cp_rank")
    ops = [
        (a, b, t)
        for e in events
        if e.get("cat") == "cpu_op" and e["name"] in SYNC_OPS
        for a, b, t in _spans([e], e["name"])
    ]
    outer = [
        (a, b, t)
        for a, b, t in ops
        if not any(c <= a and b <= d and u == t and (c, d) != (a, b) for c, d, u in ops)
    ]
    expected = sum(
        1 for a, _, t in outer for s, f, u in helper if u == t and s <= a < f
    )
    assert expected == 3 * 2  # nonzero and item once per step (item's _local_scalar_dense inside)
    report = _analyze(str(sync_profile))
    (finding,) = [f for f in report["findings"] if f["rule"] == "host-sync-in-step"]
    assert finding["severity"] == "info" and finding["helper"] == "get_batch_on_this_cp_rank"
    got = _values(finding, 0)
    basis = "per step (total / 3 steps)"
    assert got[f"host-sync operators inside get_batch_on_this_cp_rank {basis} (host ranges)"] == (
        round(expected / 3, 2)
    )
    assert got[f"calls of get_batch_on_this_cp_rank {basis} (host ranges)"] == len(helper) / 3
    shared = {e["name"]: e["value"] for e in finding["evidence"] if e["rank"] is None}
    assert shared == {"host time blocked on the GPU": NOT_OBSERVED}
    assert finding["expected_saving_ms"] is None
    row = next(
        h
        for h in report["host_time"]["helpers"]
        if h["helper"] == "get_batch_on_this_cp_rank" and h["window"] == "ProfilerStep"
    )
    assert row["sync_ops"] == expected


def test_nsys_export_without_cupti_tables_finds_the_padded_path(tmp_path: Path) -> None:
    db = tmp_path / "no_cupti.sqlite"
    with gzip.open(NSYS) as src, open(db, "wb") as out:
        shutil.copyfileobj(src, out)
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            if table.startswith("CUPTI_ACTIVITY_KIND_"):
                conn.execute(f'DROP TABLE "{table}"')
        name = "coalesce(e.text, (SELECT value FROM StringIds WHERE id = e.textId))"
        per_arm = dict(
            conn.execute(
                f"""SELECT {name.replace('e.', 'a.')} AS arm, count(*)
                FROM NVTX_EVENTS a JOIN NVTX_EVENTS e
                  ON e.globalTid = a.globalTid AND e.start >= a.start AND e.start < a.end
                WHERE {name.replace('e.', 'a.')} LIKE 'nsys_arm:%'
                  AND {name} LIKE '%get_cu_seqlens_on_cp_rank'
                GROUP BY arm"""
            ).fetchall()
        )
        arm_ranges = conn.execute(
            f"SELECT count(*) FROM NVTX_EVENTS a WHERE {name.replace('e.', 'a.')} "
            "= 'nsys_arm:auto_clone'"
        ).fetchone()[0]
    assert per_arm and set(per_arm) == {"nsys_arm:auto_clone"}
    report = _analyze(str(db), "--step-pattern", "^nsys_arm:")
    assert report["host_time"]["gpu_activity"] is False
    mine = [f for f in report["findings"] if f["rule"] == "padded-path-without-padding"]
    assert [f["window"] for f in mine] == ["nsys_arm:auto_clone"]
    calls = {
        e["rank"]: e["value"]
        for e in mine[0]["evidence"]
        if e["name"].startswith("calls ") and e["rank"] is not None
    }
    steps = {
        rank: sum(1 for w in report["windows"] if w["rank"] == rank and w["group"] == arm)
        for rank in calls
        for arm in ["nsys_arm:auto_clone"]
    }
    # every arm range is one step; calls per step x steps gives back every helper range
    assert sum(steps.values()) == arm_ranges == 2
    assert sum(calls[r] * steps[r] for r in calls) == per_arm["nsys_arm:auto_clone"] == 96
    assert any(f["rule"] == "gpu-not-observed" for f in report["findings"])


def test_compare_of_cpu_arms_states_the_gpu_figures_as_not_observed() -> None:
    result = RUNNER.invoke(
        app,
        ["compare", "--base", str(SMOKE), "--base-window", "arm:fixed", "--head-window",
         "arm:broken"],
    )
    assert result.exit_code == 0, result.output
    text = result.output
    assert "where the step went: not observed: no GPU activity in this trace" in text
    assert "Total GPU (" not in text and "GPU busy ms" not in text  # no table of zeros
    assert "WARNING [padded-path-without-padding]" in text  # the head's host-range finding
    report = json.loads(
        RUNNER.invoke(
            app,
            ["compare", "--base", str(SMOKE), "--base-window", "arm:fixed", "--head-window",
             "arm:broken", "--json"],
        ).output
    )
    assert report["gpu_observed"] is False
    assert any("no GPU activity in the base and head trace" in n for n in report["notes"])
