"""The run page built ahead of its views: what it shows of the report is built when the
worker stores the report, and stored; a view reads it and adds the run's row.

The report's part of a run page (figures, tables, links) depends only on the run's page
summary and its id, and building it (the timeline figures, the template over ~0.3 MB of
figure JSON) took the API tens of milliseconds per first view of a run: 20 first views a
second saturated the server's core. :func:`store_built` is the analysis worker's hook
(``service.worker``; the composition root, ``cptrace.worker``, hands it over), so that cost is
paid once per analysis, in the worker's process. A view (:func:`built_page`) reads the stored
``BuiltPage`` (``service.storage``'s ``run_page_parts``); a run analysed before, or by a worker
without the hook, has it built at its first view and stored.

What is stored is tied to the page summary it was built from (its stamp: a re-analysis makes
it stale) and to the code that built it (:data:`VERSION`, a digest of that code's files: a
deploy that changes a template or a figure rebuilds each page at its next view).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from contracts.version import __version__
from service import store as service_store
from service.page_summary import BuiltPage, RunPageSummary
from service.storage.engine import AnyDatabase
from web import data, render
from web.store import ServiceStore, WebStore

WEB_DIR = Path(__file__).parent
REPORT_TEMPLATE = "run_report.html"
_SOURCES = (
    "data.py", "figures.py", "page_parts.py", "render.py", "templates/macros.html",
    f"templates/{REPORT_TEMPLATE}",
)  # fmt: skip
"""The files whose code decides what a built page holds."""


def _version() -> str:
    digest = hashlib.sha256(__version__.encode())
    for name in _SOURCES:
        digest.update((WEB_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


VERSION = _version()
"""What a stored page must have been built by to be shown: a digest of :data:`_SOURCES`."""


def build(run_id: int, summary: RunPageSummary) -> BuiltPage:
    """The report's part of run ``run_id``'s page, as its HTML and its ``.json`` twin's fields."""
    parts = data.report_parts(run_id, summary)
    html = render.env.get_template(REPORT_TEMPLATE).render(page=parts, run_id=run_id)
    return BuiltPage(charts=len(parts.figures), html=html, page_json=parts.model_dump_json())


def built_page(store: WebStore, run_id: int) -> BuiltPage | None:
    """The run's built page: stored, or built now from its page summary (then stored, unless
    that summary was replaced meanwhile). None when the run has no report yet."""
    found = store.get_page_parts(run_id, VERSION)
    if found is not None:
        return found
    summary = store.get_page_summary(run_id)
    if summary is None:
        return None
    page = build(run_id, summary)
    if summary.stamp is not None:  # None: not the stored summary (a newer one came meanwhile)
        store.store_page_parts(run_id, VERSION, summary.stamp, page)
    return page


def store_built(db: AnyDatabase, run_id: int) -> None:
    """The worker's hook, called once the run's report and page summary are stored: build the
    page and store it. The summary is read without keeping it parsed (the worker views no
    page)."""
    summary = service_store.get_page_summary(db, run_id, keep=False)
    if summary is not None and summary.stamp is not None:
        ServiceStore(db).store_page_parts(run_id, VERSION, summary.stamp, build(run_id, summary))


def json_twin(head: data.RunPageHead, page: BuiltPage | None) -> bytes:
    """``/runs/{id}.json``: ``data.RunPage``'s JSON, the stored report fields then the run's
    (joined as text: nothing stored is parsed or written again)."""
    parts = page.page_json if page is not None else data.RunPageParts().model_dump_json()
    return (parts[:-1] + "," + head.model_dump_json()[1:]).encode()
