"""The run page names the line of a host sync that the profiled process recorded (issue 25).

End to end on the real H200 bundle of ``cptrace profile --torch`` of an unedited plain job
(``tests/data/plain-h200-profile``: ``check_finite`` reads the loss with ``.item()`` on line 7,
the line after its ``def``): uploaded over HTTP to the real app under uvicorn, analysed by the
real worker, the run page and its JSON twin read back over HTTP.
"""

from __future__ import annotations

import httpx
import pytest
from markupsafe import escape
from stored_runs import drain_worker
from testkit import DATA_DIR
from web_server import serve

from analyzers.findings.summary import RECORDED_LINE
from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings

BUNDLE = DATA_DIR / "plain-h200-profile" / "plain_mlp_adamw.tar.gz"
POINTER = "train.py:7 in check_finite: aten::item x3, 6 blocking"


def test_run_page_shows_the_recorded_line_of_the_item(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    settings = Settings(data_dir=tmp_path_factory.mktemp("sync-line") / "data", ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with serve(app) as url:
        resp = httpx.post(
            f"{url}/api/v1/uploads/bundles",
            files={"bundle": (BUNDLE.name, BUNDLE.read_bytes())},
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["run_id"]
        drain_worker(settings)
        assert httpx.get(f"{url}/api/v1/runs/{run_id}").json()["status"] == "analysed"
        twin = httpx.get(f"{url}/runs/{run_id}.json").json()
        body = httpx.get(f"{url}/runs/{run_id}").text
    (pointer,) = [p for p in twin["summary"]["sync_pointers"] if p["call_lines"]]
    assert pointer["frame"] == "train.py:7 in check_finite" and pointer["call_lines"] == [7]
    first = twin["do_first"][0]
    assert "at train.py:7 in check_finite out of the step" in first["action"]
    assert RECORDED_LINE in first["evidence"]
    summary = body[body.index('id="summary"') : body.index('id="findings"')]
    assert f"Host sync: <code>{POINTER}" in summary
    do_first = body[body.index('id="do-first"') : body.index('id="findings"')]
    assert str(escape(first["action"])) in do_first
    assert "train.py:6" not in body  # Kineto's def line is nowhere on the page
