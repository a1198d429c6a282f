"""Playwright helpers for the page tests: Debian's Chromium, console-error capture, chart checks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from web.screenshots import CHROMIUM_ARGS, find_chromium


def require_chromium() -> str:
    executable = find_chromium()
    if executable is None:
        pytest.skip("Chromium is not installed (make test installs it: apt-get install chromium)")
    return executable


@contextmanager
def browser_page() -> Iterator[Any]:
    """A fresh page of a headless Chromium; yields it with ``page.errors`` collecting problems."""
    from playwright.sync_api import sync_playwright

    executable = require_chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=executable, headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            page.on(
                "console",
                lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.on(
                "response",
                lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
            )
            page.errors = errors  # type: ignore[attr-defined]
            yield page
        finally:
            browser.close()


def open_page(page: Any, url: str) -> None:
    """Load ``url``, wait until every chart is drawn, and require a clean console."""
    page.errors.clear()
    response = page.goto(url, wait_until="load")
    assert response is not None and response.status == 200, url
    page.wait_for_selector("body[data-charts-ready='true']", timeout=30_000)
    assert page.errors == [], page.errors


def charts(page: Any) -> dict[str, dict[str, Any]]:
    """What plotly actually drew: per chart id, the trace names and point counts."""
    return page.evaluate(
        """() => {
        const out = {};
        document.querySelectorAll('.js-plotly-plot').forEach(el => {
          out[el.id] = {
            traces: el.data.map(t => t.name),
            points: el.data.map(t => (t.x || t.y || []).length),
            svgTraces: el.querySelectorAll('.trace').length,
          };
        });
        return out;
      }"""
    )
