"""Save a PNG of every dashboard page of a running server (for the README and docs/web.md).

The pages to shoot are discovered from the server's own JSON twins: the newest analysed run,
a comparison (two arms of that run when it has them, else the two newest analysed runs), the
history of its configuration, the run list and the catalog; the newest failed run, and the
loop's pages (pull requests, one pull request, a batch, a job, the jobs) when there are any.
Debian's Chromium is driven through Playwright; nothing but the given server is contacted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


class ScreenshotError(RuntimeError):
    """The browser is missing, or the server has nothing to show or answered an error."""


def find_chromium() -> str | None:
    """Debian's Chromium (``CPTRACE_CHROMIUM`` overrides); None when not installed."""
    override = os.environ.get("CPTRACE_CHROMIUM")
    if override:
        return override if Path(override).exists() else None
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser (Playwright ``Browser``), closed on exit."""
    from playwright.sync_api import sync_playwright

    executable = find_chromium()
    if executable is None:
        raise ScreenshotError(
            "Chromium is not installed: apt-get install chromium (or set CPTRACE_CHROMIUM)"
        )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=executable, headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            yield browser
        finally:
            browser.close()


@dataclass(frozen=True, slots=True)
class Shot:
    """One page to photograph: file stem and site-relative path."""

    name: str
    path: str


def discover_pages(server: str, client: httpx.Client | None = None) -> list[Shot]:
    """Ask the server's JSON twins which runs exist and pick pages that show every chart."""
    own = client is None
    client = client or httpx.Client(timeout=30)
    try:
        runs = _get(client, f"{server}/runs.json?verdict=findings&per_page=20")["runs"]
        runs += _get(client, f"{server}/runs.json?verdict=clean&per_page=20")["runs"]
        runs.sort(key=lambda r: r["id"], reverse=True)
        if not runs:
            raise ScreenshotError(f"{server} has no analysed runs to show")
        shots = [Shot("runs", "/runs")]
        run = _get(client, f"{server}/runs/{runs[0]['id']}.json")
        shots.append(Shot("run", f"/runs/{runs[0]['id']}"))
        if run["arm_comparisons"]:
            # the widest pair: first window group against the last (alphabetical)
            arms = run["arm_comparisons"]
            first = min(a["base_window"] for a in arms)
            widest = max((a for a in arms if a["base_window"] == first),
                         key=lambda a: a["head_window"])  # fmt: skip
            shots.append(Shot("compare", widest["url"]))
        elif len(runs) > 1:
            shots.append(Shot("compare", f"/compare/{runs[1]['id']}/{runs[0]['id']}"))
        config = run["run"].get("config_key")
        history = f"/history?config_key={quote(config)}" if config else "/history"
        shots += [Shot("history", history), Shot("catalog", "/catalog")]
        return shots + _failure_and_loop_shots(server, client)
    finally:
        if own:
            client.close()


def _failure_and_loop_shots(server: str, client: httpx.Client) -> list[Shot]:
    """The newest failed run's page, and the loop's pages when the loop has measured a pull
    request (a pull request, its newest batch, that batch's first job)."""
    shots = []
    failed = _get(client, f"{server}/runs.json?verdict=failed&per_page=1")["runs"]
    if failed:
        shots.append(Shot("run-failed", f"/runs/{failed[0]['id']}"))
    pulls = _get(client, f"{server}/pulls.json")
    if pulls["pulls"]:
        pull = pulls["pulls"][0]
        shots += [
            Shot("pulls", "/pulls"),
            Shot("pull", f"/pulls/{pull['repo']}/{pull['pr_number']}"),
        ]
        batch = next((b for b in pull["suites"] if b["jobs"]), None)
        if batch is not None:
            shots.append(Shot("batch", f"/batches/{batch['id']}"))
            jobs = _get(client, f"{server}/batches/{batch['id']}.json")["jobs"]
            shots.append(Shot("job", f"/jobs/{jobs[-1]['id']}"))
        shots.append(Shot("jobs", "/jobs"))
    return shots


def _get(client: httpx.Client, url: str) -> dict[str, Any]:
    response = client.get(url)
    if response.status_code != 200:
        raise ScreenshotError(f"GET {url} answered {response.status_code}: {response.text[:300]}")
    return dict(response.json())


def take_screenshots(
    server: str, out_dir: Path, shots: list[Shot] | None = None, *, width: int = 1400
) -> list[Path]:
    """Photograph each page (full height) once its charts are drawn; returns the PNG paths.

    A page that logs a console error or fails to draw its charts is an error, not a picture.
    """
    server = server.rstrip("/")
    shots = shots if shots is not None else discover_pages(server)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        for shot in shots:
            errors.clear()
            response = page.goto(f"{server}{shot.path}", wait_until="load")
            if response is None or response.status != 200:
                status = response.status if response else "no response"
                raise ScreenshotError(f"{shot.path} answered {status}")
            page.wait_for_selector("body[data-charts-ready='true']", timeout=30_000)
            if errors:
                raise ScreenshotError(f"{shot.path} logged console errors: {errors}")
            target = out_dir / f"{shot.name}.png"
            page.screenshot(path=str(target), full_page=True)
            written.append(target)
    return written
