"""Host time per helper wherever two CPU-only runs are compared: page, JSON twin, PR comment, CLI.

Two real CPU runs (gloo, 2 ranks, no GPU activity): the checked-in ``cpu_smoke`` bundle and a
fresh one written by the real runner (``cptrace run runners/examples/cpu_smoke.yaml``), uploaded
to the real service, analysed by the real worker and compared across runs (the first run's
``fixed`` arm against the second run's ``broken`` arm, where the padded path and the zero-fill
run). The host-time figures of the comparison page, its JSON twin, its PR-comment preview, the
PR-comment endpoint, ``cptrace compare`` (table and ``--json``) and ``cptrace pr-comment``
(against the app under uvicorn) must equal the ones recomputed here from the two stored reports'
``host_time`` rows. A GPU run (the demo nsys bundle) against a CPU arm names the one side
without GPU activity.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from stored_runs import assert_analysed, drain_worker, upload_bundles
from testkit import DATA_DIR
from web_server import serve

from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CPU_BUNDLE = DATA_DIR / "cpu-gloo" / "cpu_smoke.tar.gz"
GPU_BUNDLE = ROOT / "demo" / "bundles" / "te-2.20.2-nsys-3arms.tar.gz"
SPEC = ROOT / "runners" / "examples" / "cpu_smoke.yaml"
CPTRACE = [str(Path(sys.executable).with_name("cptrace"))]  # the console script
BASE_WINDOW, HEAD_WINDOW = "arm:fixed", "arm:broken"


@dataclass
class Runs:
    client: TestClient
    app: Any
    ids: dict[str, int]
    bundles: dict[str, Path]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real entry point in a child process (piped: rich's fixed 200-column width)."""
    return subprocess.run(
        [*CPTRACE, *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("host-compare")
    fresh = root / "smoke"
    made = _cli("run", str(SPEC), "--nproc", "2", "--out", str(fresh), "--pack",
                "--timeout", "300")  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    bundles = {"stored": CPU_BUNDLE, "fresh": fresh.with_name("smoke.tar.gz"), "gpu": GPU_BUNDLE}
    assert bundles["fresh"].is_file()
    settings = Settings(data_dir=root / "data", ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with TestClient(app) as client:
        ids = upload_bundles(client, token, bundles)
        drain_worker(settings)
        assert_analysed(client, ids)
        yield Runs(client, app, ids, bundles)


def _report(runs: Runs, key: str) -> dict[str, Any]:
    resp = runs.client.get(f"/api/v1/runs/{runs.ids[key]}/analysis/result")
    assert resp.status_code == 200, resp.text
    report: dict[str, Any] = resp.json()
    return report


def _per_step(report: dict[str, Any], window: str) -> dict[str, dict[str, float]]:
    """helper -> calls, inclusive, self (per step) and first call (ms), summed over ranks,
    straight from the stored report's host-time rows."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in report["host_time"]["helpers"]:
        if row["window"] != window:
            continue
        steps = row["steps"]
        out[row["helper"]]["calls"] += row["calls"] / steps
        out[row["helper"]]["inclusive"] += row["inclusive_ns"] / steps / 1e6
        out[row["helper"]]["self"] += row["self_ns"] / steps / 1e6
        out[row["helper"]]["first"] += row["first_call_ns"] / 1e6
    return out


def _expected(runs: Runs, base: str = "stored", head: str = "fresh") -> dict[str, dict[str, Any]]:
    """The comparison's rows, recomputed: every helper of either side, base and head figures,
    its status from the call counts."""
    b = _per_step(_report(runs, base), BASE_WINDOW)
    h = _per_step(_report(runs, head), HEAD_WINDOW)
    zero = {"calls": 0.0, "inclusive": 0.0, "self": 0.0, "first": 0.0}
    rows = {}
    for helper in b.keys() | h.keys():
        bb, hh = {**zero, **b.get(helper, {})}, {**zero, **h.get(helper, {})}
        status = (
            "appeared" if not bb["calls"] else "disappeared" if not hh["calls"]
            else "calls changed" if bb["calls"] != hh["calls"] else "same calls"
        )  # fmt: skip
        rows[helper] = {"base": bb, "head": hh, "status": status}
    return rows


def _assert_row_is(row: dict[str, Any], want: dict[str, Any]) -> None:
    """One host-time row (the JSON twin's or ``cptrace compare --json``'s) against ``_expected``."""
    for side in ("base", "head"):
        assert row[f"{side}_calls"] == want[side]["calls"]
        assert row[f"{side}_inclusive_ms"] == pytest.approx(want[side]["inclusive"], abs=1e-9)
        assert row[f"{side}_ms"] == pytest.approx(want[side]["self"], abs=1e-9)
        assert row[f"{side}_first_call_ms"] == pytest.approx(want[side]["first"], abs=1e-9)
    assert row["status"] == want["status"]


def _compare_path(runs: Runs, base: str = "stored", head: str = "fresh") -> str:
    return f"/compare/{runs.ids[base]}/{runs.ids[head]}"


PARAMS = {"base_window": BASE_WINDOW, "head_window": HEAD_WINDOW}


def test_the_runs_are_cpu_only_and_the_broken_arm_runs_the_slow_paths(runs: Runs) -> None:
    for key in ("stored", "fresh"):
        report = _report(runs, key)
        assert report["host_time"]["gpu_activity"] is False
        assert not any(h["launches"] or h["gpu_time_ns"] for h in report["helpers"])
    expected = _expected(runs)
    assert expected["get_cu_seqlens_on_cp_rank"]["status"] == "appeared"
    assert expected["get_cu_seqlens_on_cp_rank"]["head"]["calls"] == 32  # 16 per rank and step
    assert expected["cp_attention.grad_zero_fill"]["status"] == "appeared"


def test_json_twin_rows_equal_the_reports(runs: Runs) -> None:
    data = runs.client.get(_compare_path(runs) + ".json", params=PARAMS).json()
    assert data["report"]["gpu_observed"] is False
    host = data["host"]
    assert host["sides_without_gpu"] == ["base", "head"]
    expected = _expected(runs)
    assert {r["helper"] for r in host["rows"]} == set(expected)
    for row in host["rows"]:
        want = expected[row["helper"]]
        _assert_row_is(row, want)
        assert row["delta_ms"] == pytest.approx(want["head"]["self"] - want["base"]["self"])
    deltas = [r["delta_ms"] for r in host["rows"]]
    assert deltas == sorted(deltas, reverse=True)  # largest self-time growth first


def _cells(table_html: str) -> dict[str, list[str]]:
    rows = {}
    for helper, body in re.findall(r'<tr data-helper="([^"]+)">(.*?)</tr>', table_html, re.S):
        rows[html.unescape(helper)] = [
            html.unescape(c) for c in re.findall(r"<td[^>]*>(?:<code>)?(.*?)(?:</code>)?</td>",
                                                 body, re.S)
        ]  # fmt: skip
    return rows


def _ms(value: float) -> str:
    return f"{value:,.3f}"


def test_page_shows_the_host_table_and_why_the_gpu_tables_are_empty(runs: Runs) -> None:
    resp = runs.client.get(_compare_path(runs), params=PARAMS)
    assert resp.status_code == 200, resp.text
    page = resp.text
    reason = re.search(r'<p class="not-observed" id="no-gpu-reason">(.*?)</p>', page, re.S)
    assert reason is not None
    assert "no GPU activity in the base and the head trace" in reason.group(1)
    assert "no launch, kernel or GPU-time rows to compare" in reason.group(1)
    for section in ('id="total-gpu"', 'id="helper-deltas"', 'id="fig-account_delta"'):
        assert section not in page
    deltas = re.search(r'<table class="deltas" id="deltas-table">.*?</table>', page, re.S)
    assert deltas is not None  # no launch, GPU-time or busy row of zeros
    assert re.findall(r'<tr data-metric="([^"]+)">', deltas.group(0)) == [
        "iteration time, median",
        "iteration time, p90",
        "span per step",
    ]
    table = re.search(r'<table class="host-time-deltas sortable".*?</table>', page, re.S)
    assert table is not None
    cells = _cells(table.group(0))
    expected = _expected(runs)
    assert set(cells) == set(expected)
    for helper, want in expected.items():
        b, h = want["base"], want["head"]
        first = [_ms(v) if v else "—" for v in (b["first"], h["first"])]
        assert cells[helper] == [
            helper,
            f"{b['calls']:g}", f"{h['calls']:g}", f"{h['calls'] - b['calls']:+g}",
            _ms(b["inclusive"]), _ms(h["inclusive"]), f"{h['inclusive'] - b['inclusive']:+,.3f}",
            _ms(b["self"]), _ms(h["self"]), f"{h['self'] - b['self']:+,.3f}",
            *first, want["status"],
        ], helper  # fmt: skip
    # the PR comment the page previews carries the same host rows
    markdown = re.search(r'<pre class="markdown">(.*?)</pre>', page, re.S)
    assert markdown is not None
    _check_comment(html.unescape(markdown.group(1)), expected)


def _check_comment(body: str, expected: dict[str, dict[str, Any]]) -> None:
    """The comment's host-time table: one row per helper whose calls or time changed, with the
    base and head calls and self ms per step of the recomputed rows."""
    assert "No GPU activity in one of the runs: no launch or kernel rows, host time instead." in (
        body
    )
    assert "Per-helper host time" in body
    assert "| launches per step |" not in body and "GPU time ms/step" not in body
    assert "GPU busy ms/step" not in body and "Where the step went" not in body  # no zeros
    rows = {
        m[0]: m[1:]
        for m in re.findall(
            r"^\| `([^`]+)` \| ([0-9.,]+) \| ([0-9.,]+) \| [^|]+ \| ([0-9.,]+) \| ([0-9.,]+) \| "
            r"[^|]+ \| ([a-z ]+) \|$",
            body,
            re.M,
        )
    }
    for helper in ("get_cu_seqlens_on_cp_rank", "cp_attention.grad_zero_fill"):
        want = expected[helper]
        assert rows[helper] == (
            f"{want['base']['calls']:,.1f}", f"{want['head']['calls']:,.1f}",
            _ms(want["base"]["self"]), _ms(want["head"]["self"]), want["status"],
        )  # fmt: skip
    grown = max(expected, key=lambda k: expected[k]["head"]["self"] - expected[k]["base"]["self"])
    assert next(iter(rows)) == grown  # largest growth first


def test_pr_comment_endpoint_and_cli_pass_the_host_rows(runs: Runs) -> None:
    expected = _expected(runs)
    base, head = runs.ids["stored"], runs.ids["fresh"]
    resp = runs.client.post(
        f"/api/v1/comparisons/{base}/{head}/pr-comment",
        json={"base_window": BASE_WINDOW, "head_window": HEAD_WINDOW},
    )
    assert resp.status_code == 200, resp.text
    _check_comment(resp.json()["body"], expected)
    with serve(runs.app) as url:  # the real app under uvicorn: the CLI reads it over HTTP
        done = _cli("pr-comment", "--server", url, "--base", str(base), "--head", str(head),
                    "--base-window", BASE_WINDOW, "--head-window", HEAD_WINDOW)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    _check_comment(done.stdout, expected)
    assert done.stdout.startswith("<!-- cptrace:suite=default -->")


def test_cli_compare_prints_and_dumps_the_same_rows(runs: Runs) -> None:
    expected = _expected(runs)
    args = ["--base", str(runs.bundles["stored"]), "--base-window", BASE_WINDOW,
            "--head", str(runs.bundles["fresh"]), "--head-window", HEAD_WINDOW]  # fmt: skip
    dumped = _cli("compare", *args, "--json")
    assert dumped.returncode == 0, dumped.stderr
    payload = json.loads(dumped.stdout)
    assert payload["gpu_observed"] is False and payload["base_label"] == BASE_WINDOW
    assert {r["helper"] for r in payload["host_rows"]} == set(expected)
    for row in payload["host_rows"]:
        _assert_row_is(row, expected[row["helper"]])
    printed = _cli("compare", *args)
    assert printed.returncode == 0, printed.stderr
    text = printed.stdout
    assert "where the step went: not observed: no GPU activity in this trace" in text
    assert f"{BASE_WINDOW} -> {HEAD_WINDOW}: host time per helper from the ranges" in text
    for helper, want in expected.items():
        line = next(ln for ln in text.splitlines() if re.match(rf"│ {re.escape(helper)} +│", ln))
        cells = [c.strip() for c in line.strip("│").split("│")]
        b, h = want["base"], want["head"]
        first = [f"{v:.3f}" if v else "-" for v in (b["first"], h["first"])]
        assert cells == [
            helper, f"{b['calls']:g}", f"{h['calls']:g}", f"{h['calls'] - b['calls']:+g}",
            f"{b['inclusive']:.3f}", f"{h['inclusive']:.3f}",
            f"{h['inclusive'] - b['inclusive']:+.3f}", f"{b['self']:.3f}", f"{h['self']:.3f}",
            f"{h['self'] - b['self']:+.3f}", *first, want["status"],
        ], helper  # fmt: skip


def test_gpu_run_against_a_cpu_arm_names_the_side_without_gpu(runs: Runs) -> None:
    params = {"base_window": "nsys_arm:auto_clone", "head_window": HEAD_WINDOW}
    path = _compare_path(runs, base="gpu", head="fresh")
    data = runs.client.get(path + ".json", params=params).json()
    assert data["host"]["sides_without_gpu"] == ["head"]
    base_rows = _per_step(_report(runs, "gpu"), "nsys_arm:auto_clone")
    rows = {r["helper"]: r for r in data["host"]["rows"]}
    assert base_rows and set(base_rows) <= set(rows)  # the GPU side's host ranges count too
    # TE's helpers nest (te_cp_forward holds the attention calls): inclusive is not self here
    assert any(want["inclusive"] > want["self"] + 1 for want in base_rows.values())
    for helper, want in base_rows.items():
        assert rows[helper]["base_calls"] == want["calls"]
        assert rows[helper]["base_inclusive_ms"] == pytest.approx(want["inclusive"], abs=1e-9)
        assert rows[helper]["base_ms"] == pytest.approx(want["self"], abs=1e-9)
        assert rows[helper]["base_first_call_ms"] == pytest.approx(want["first"], abs=1e-9)
    page = runs.client.get(path, params=params).text
    reason = re.search(r'<p class="not-observed" id="no-gpu-reason">(.*?)</p>', page, re.S)
    assert reason is not None and "no GPU activity in the head trace" in reason.group(1)
