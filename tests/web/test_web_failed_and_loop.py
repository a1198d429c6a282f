"""Failed and hung runs on every page, the pull-request comment for them, and the loop's pages.

All real: bundles (``tests/failed_bundles.py``: real faulthandler dumps, a real exception record,
the checked-in CPU capture) uploaded through the API, analysed by the real worker; a batch
queued by the planner's own ``queue_batches``, its jobs claimed and finished through the job
API by a runner token, published by the loop's ``Publisher`` to the local GitHub stand-in;
pages read over a real uvicorn server, one in headless Chromium.

The raised run has traces (the same as the run that ended cleanly): before the failure
verdict it read like that run, as if the job had ended well.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_github import FakeGitHubServer
from fastapi.testclient import TestClient
from web_browser import browser_page, open_page
from web_server import serve

from cptrace.app import create_app
from pr_bot.github import GitHubConfig
from service.auth import Role, create_token
from service.core.config import Settings
from service.github_loop.config import LoopSettings
from service.github_loop.models import RepoConfig
from service.github_loop.planner import BatchPlan, Target, queue_batches
from service.github_loop.publisher import Publisher
from service.storage.database import immediate
from tests.failed_bundles import (
    CPU_SMOKE,
    faulthandler_stacks,
    hung_without_traces,
    raised_with_traces,
)
from tests.service.service_factories import drain_worker
from web.pr_routes import github_config

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

REPO = "octo/model"
PR = 7
HEAD = "c" * 40
BASE = "b" * 40
SPEC = {"name": "smoke", "implementation": "bundled", "seqlens": [64, 32]}


def _tags(spec: str, suite: str = "smoke") -> dict[str, Any]:
    return {"repo": REPO, "pr": PR, "suite": suite, "spec_name": spec, "commit": HEAD,
            "branch": "topic"}  # fmt: skip


def _upload(client: TestClient, token: str, archive: Path) -> int:
    resp = client.post(
        "/api/v1/uploads/bundles",
        files={"bundle": (archive.name, archive.read_bytes())},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert resp.status_code == 201, resp.text
    return int(resp.json()["run_id"])


def _queue(app: Any) -> list[int]:
    target = Target(REPO, "https://github.test/octo/model.git", HEAD, "topic", PR, BASE, "main")
    plans = [
        BatchPlan(suite="smoke", config={"thresholds": {}, "gpus": 0},
                  specs=[("raised", SPEC), ("hung", SPEC)]),
        BatchPlan(suite="unit", config={"thresholds": {}, "gpus": 0}, specs=[("slow", SPEC)]),
    ]  # fmt: skip

    def write(conn: Any) -> list[int]:
        with immediate(conn):
            return queue_batches(conn, target, plans, repo_config=RepoConfig(), max_attempts=2,
                                 delivery_id="d1")  # fmt: skip

    return app.state.db.write(write)


def _claim(client: TestClient, token: str) -> dict[str, Any]:
    resp = client.post("/api/v1/jobs/claim", json={"runner": "h200-a", "gpus": 0, "wait_s": 0},
                       headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("failed-web")
    stacks = faulthandler_stacks(tmp)
    raised = raised_with_traces(tmp, stacks, run=_tags("raised"))
    hung = hung_without_traces(tmp, stacks, run=_tags("hung"))
    settings = Settings(data_dir=tmp / "data", ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER, name="h200-a"))
    with TestClient(app) as client, FakeGitHubServer() as github:
        clean = _upload(client, token, CPU_SMOKE)
        batches = _queue(app)
        jobs = {}
        for name, archive in (("raised", raised), ("hung", hung)):  # the queue's order
            job = _claim(client, token)
            run_id = _upload(client, token, archive.with_suffix(".tar.gz"))
            done = client.post(f"/api/v1/jobs/{job['id']}/complete", json={"run_id": run_id},
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            assert done.status_code == 200, done.text
            jobs[name] = (job["id"], run_id)
        running = _claim(client, token)  # the unit suite's job stays on its runner
        drain_worker(settings)
        loop = LoopSettings(public_url="https://cptrace.test")
        config = GitHubConfig(token=github.token, api_url=github.url)
        app.dependency_overrides[github_config] = lambda: config
        publisher = Publisher(app.state.db, loop, config)
        assert publisher.tick() == 1  # the smoke batch; unit still runs
        with serve(app) as url:
            yield {
                "client": client, "url": url, "github": github, "clean": clean,
                "raised": jobs["raised"][1], "hung": jobs["hung"][1], "jobs": jobs,
                "running": running["id"], "batches": batches, "token": token,
            }  # fmt: skip


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_a_failed_run_is_failed_on_its_page_and_twin_never_clean(world: dict[str, Any]) -> None:
    for key, kind in (("raised", "failed"), ("hung", "hung")):
        run_id = world[key]
        page = httpx.get(f"{world['url']}/runs/{run_id}.json").json()
        assert page["verdict"] == "failed", key
        html = httpx.get(f"{world['url']}/runs/{run_id}").text
        assert 'class="badge verdict-failed">failed<' in html and "verdict-clean" not in html
        assert f"The job {kind}" in _text(html)
        assert "[rank0] step 2 done" in html  # the log tail
    raised = httpx.get(f"{world['url']}/runs/{world['raised']}.json").json()
    assert raised["run"]["status"] == "analysed"  # analysed like a clean run, yet failed
    assert raised["failure"]["headline"].startswith("rank 1 raised ValueError: packed token")
    assert "in _pack_step; rank 0 was waiting in all_reduce" in raised["failure"]["headline"]
    hung = httpx.get(f"{world['url']}/runs/{world['hung']}.json").json()
    stacks = hung["failure"]["stacks"]
    assert [s["rank"] for s in stacks] == ["0", "1"]
    assert all(re.search(r"train\.py:\d+ in wait_for_peer$", s["waiting_at"]) for s in stacks)
    assert all("Current thread" in s["text"] for s in stacks)
    html = httpx.get(f"{world['url']}/runs/{world['hung']}").text
    assert html.count("waiting at <code>") == 2 and html.count("in wait_for_peer") >= 4


def test_the_runs_list_compare_and_history_say_failed(world: dict[str, Any]) -> None:
    url = world["url"]
    verdicts = {r["id"]: r["verdict"] for r in httpx.get(f"{url}/runs.json").json()["runs"]}
    ended_well = verdicts.pop(world["clean"])
    assert ended_well == "findings"  # the same traces as the raised run, which reads failed
    assert verdicts == {world["raised"]: "failed", world["hung"]: "failed"}
    same_traces = httpx.get(f"{url}/runs.json?verdict=findings").json()["runs"]
    assert [r["id"] for r in same_traces] == [world["clean"]]
    tagged = httpx.get(f"{url}/runs.json?repo={REPO}&pr={PR}&suite=smoke").json()["runs"]
    assert sorted(r["id"] for r in tagged) == sorted([world["raised"], world["hung"]])
    assert {(r["pr"], r["suite"], r["spec_name"]) for r in tagged} == {
        (PR, "smoke", "raised"), (PR, "smoke", "hung")}  # fmt: skip
    runs_html = httpx.get(f"{url}/runs").text
    assert f'<a href="/pulls/{REPO}/{PR}">{REPO}#{PR}</a>' in runs_html
    compare = httpx.get(f"{url}/compare/{world['clean']}/{world['raised']}.json").json()
    assert compare["head"]["verdict"] == "failed" and compare["base"]["verdict"] == "findings"
    assert compare["head_failure"]["headline"].startswith("rank 1 raised ValueError")
    assert compare["base_failure"] is None
    assert compare["markdown"].splitlines()[1].endswith(": :x: failed")
    compare_html = httpx.get(f"{url}/compare/{world['clean']}/{world['raised']}").text
    assert 'id="head-failed"' in compare_html and "The head run's job failed" in compare_html
    config = httpx.get(f"{url}/runs/{world['raised']}.json").json()["run"]["config_key"]
    history = httpx.get(f"{url}/history", params={"config_key": config}).text
    table = history.split('id="history-table"', 1)[1]
    row = next(r for r in table.split("<tr") if f'/runs/{world["raised"]}"' in r)
    assert "verdict-failed" in row
    points = httpx.get(f"{url}/history.json", params={"config_key": config}).json()["points"]
    assert {p["point"]["run_id"]: p["point"]["failed"] for p in points} == {
        world["clean"]: False, world["raised"]: True}  # fmt: skip


def test_the_pr_comment_says_which_rank_raised_where_and_each_hung_rank_stack(
    world: dict[str, Any],
) -> None:
    github = world["github"]
    (body,) = github.bodies(REPO, PR)
    assert body.startswith("<!-- cptrace:suite=smoke -->")
    raised = body.split("#### `raised`", 1)[1].split("#### `hung`", 1)[0]
    assert ":x: **The job failed**: rank 1 raised ValueError: packed token count 8190" in raised
    assert "in _pack_step; rank 0 was waiting in all_reduce" in raised
    assert "<summary>rank 0 waiting at " in raised and "<summary>traceback</summary>" in raised
    hung = body.split("#### `hung`", 1)[1]
    assert "the job hung and the watchdog stopped it after 3 s" in hung
    for rank in (0, 1):
        waiting = rf"<summary>rank {rank} waiting at \S*train\.py:\d+ in wait_for_peer"
        assert re.search(waiting, hung)
    assert hung.count('File "') >= 4 and "<summary>log tail</summary>" in hung
    status = github.statuses_for(HEAD)[-1]
    assert status["context"] == "cptrace/smoke" and status["state"] == "failure"
    assert "raised: rank 1 raised ValueError" in status["description"]


def test_the_pr_comment_endpoint_over_a_failed_head_posts_failure(world: dict[str, Any]) -> None:
    answer = httpx.post(
        f"{world['url']}/api/v1/comparisons/{world['clean']}/{world['raised']}/pr-comment",
        json={"repo": REPO, "pr": 99, "suite": "manual", "post": True, "status": True},
        headers={"Authorization": f"Bearer {world['token']}"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status_state"] == "failure"
    (body,) = world["github"].bodies(REPO, 99)
    assert body.splitlines()[1] == "### cptrace · manual: :x: failed"
    assert "The head run's job failed; its figures cover only what ran before." in body
    assert ":x: **The job failed**: rank 1 raised ValueError" in body
    status = world["github"].statuses_for(HEAD)[-1]
    assert (status["context"], status["state"]) == ("cptrace/manual", "failure")
    assert status["description"].startswith("a job failed: rank 1 raised ValueError")


def test_pull_batch_and_job_pages_and_their_twins(world: dict[str, Any]) -> None:
    url = world["url"]
    smoke, unit = world["batches"]
    pulls = httpx.get(f"{url}/pulls.json").json()
    (pull,) = pulls["pulls"]
    assert (pull["repo"], pull["pr_number"], pull["head_sha"], pull["batches"]) == (
        REPO, PR, HEAD, 2)  # fmt: skip
    assert {s["suite"]: (s["status"], s["state"]) for s in pull["suites"]} == {
        "smoke": ("published", "error"), "unit": ("queued", None)}  # fmt: skip
    page = httpx.get(f"{url}/pulls/{REPO}/{PR}.json").json()
    assert [b["suite"] for b in page["head_suites"]] == ["smoke", "unit"]
    comment = page["head_suites"][0]["comment_url"]
    assert comment == "https://github.test/c/1001"  # the html_url the stand-in answers
    assert {r["id"] for r in page["runs"]} == {world["raised"], world["hung"]}
    html = httpx.get(f"{url}/pulls/{REPO}/{PR}").text
    assert f'href="{comment}"' in html and 'class="badge state-error"' in html
    batch = httpx.get(f"{url}/batches/{smoke}.json").json()
    assert [(j["name"], j["status"], j["runner"], j["run"]["verdict"]) for j in batch["jobs"]] == [
        ("raised", "completed", "h200-a", "failed"), ("hung", "completed", "h200-a", "failed")]
    assert batch["pull_url"] == f"/pulls/{REPO}/{PR}"
    running = httpx.get(f"{url}/jobs/{world['running']}.json").json()["job"]
    assert running["status"] == "running" and running["runner"] == "h200-a"
    assert running["lease_expires_at"] > 0 and running["batch_id"] == unit
    html = httpx.get(f"{url}/batches/{unit}").text
    assert "<time>" in html and "h200-a" in html  # the lease of the running job
    job_id, run_id = world["jobs"]["hung"]
    job = httpx.get(f"{url}/jobs/{job_id}.json").json()
    assert job["failure"]["headline"].startswith("the job hung")
    assert job["job"]["run"]["id"] == run_id and job["batch"]["id"] == smoke
    listed = httpx.get(f"{url}/jobs.json?status=running").json()["jobs"]
    assert [j["id"] for j in listed] == [world["running"]]
    for bad in ("/batches/999.json", "/jobs/999.json"):
        answer = httpx.get(url + bad)
        assert answer.status_code == 404 and answer.json()["ok"] is False
    assert httpx.get(f"{url}/jobs?status=lost").status_code == 400
    assert httpx.get(f"{url}/jobs?status=").status_code == 200  # the form's "any"
    assert httpx.get(f"{url}/jobs.json?status=lost").status_code in (400, 422)


@pytest.mark.browser
def test_docs_load_offline_in_chromium_and_the_hung_run_shows_both_stacks(
    world: dict[str, Any],
) -> None:
    with browser_page() as page:
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        page.errors.clear()
        page.goto(f"{world['url']}/docs", wait_until="load")
        page.wait_for_selector(".swagger-ui .opblock", timeout=30_000)
        assert page.errors == [], page.errors
        assert all(u.startswith(world["url"]) for u in requested), requested  # no CDN
        open_page(page, f"{world['url']}/runs/{world['hung']}")
        assert page.locator("h1 .badge").inner_text() == "failed"
        summaries = page.locator("#failure details.rank-stack summary").all_inner_texts()
        assert len(summaries) == 2 and all("in wait_for_peer" in s for s in summaries)
        assert "clean" not in page.locator("main").inner_text()
        open_page(page, f"{world['url']}/pulls/{REPO}/{PR}")
        assert page.locator("#verdicts tbody tr").count() == 2
        open_page(page, f"{world['url']}/batches/{world['batches'][0]}")
        assert page.locator("#jobs-table tbody tr").count() == 2
        assert json.loads(page.evaluate("() => JSON.stringify(document.title)")).startswith("Batch")
