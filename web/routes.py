"""The dashboard pages and their ``.json`` twins (one APIRouter, included by ``create_app``).

Each HTML route renders a template over the model its data function in :mod:`web.data` returns;
the ``.json`` route returns that same model. ``.json`` routes are declared before the HTML route
of the same path, because ``/runs/{run_id}`` would otherwise claim ``/runs/3.json``. Errors of the
store (``service.core.errors.ApiError``: 404 unknown run, 409 not analysed yet) keep the API's
JSON shape on ``.json`` routes and become an HTML error page with the same status on pages.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ValidationError

from service.api.deps import ReadAccess
from service.core.errors import ApiError, BadRequest, NotFound
from web import data, loop_data, page_parts
from web.render import templates
from web.store import LoopStoreDep, RunId, StoreDep

WEB_DIR = Path(__file__).parent
STATIC_DIR = WEB_DIR / "static"
PLOTLY_JS = "plotly.min.js"

router = APIRouter(tags=["pages"])
T = TypeVar("T")


def plotly_js_path() -> Path:
    """plotly.js as shipped inside the installed plotly package (no CDN, no copy to keep fresh).

    ``find_spec`` locates the package without importing it (importing plotly costs ~1 s).
    """
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the plotly package is not installed; the dashboards need plotly.js")
    return Path(next(iter(spec.submodule_search_locations))) / "package_data" / PLOTLY_JS


def _page(request: Request, template: str, model: BaseModel, **extra: Any) -> HTMLResponse:
    context = {"page": model, "json_url": _json_url(request), **extra}
    return templates.TemplateResponse(request, template, context)


def _json_url(request: Request) -> str:
    path = request.url.path.rstrip("/") or "/runs"
    query = f"?{request.url.query}" if request.url.query else ""
    return f"{path}.json{query}"


def _error(request: Request, status: int, message: str) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "error.html", {"status": status, "message": message}, status_code=status
    )


PAGE_BUILDS = threading.BoundedSemaphore(1)
"""How many HTML pages are built and rendered at once (in the thread pool; the rest wait for
it). One: the GIL runs one Python thread at a time, so a second build gains no throughput, but
every thread ready to run is one more the event loop competes with for the GIL each time its
reads give it up (a sqlite query, a socket wait). 20 pages a second built side by side held
the API's event-loop reads for hundreds of milliseconds; one at a time, a read waits for one
build's slice at most (``benchmarks/service_bench.py``, mixed pass)."""


def _html(request: Request, template: str, build: Callable[[], BaseModel]) -> HTMLResponse:
    """An HTML page from its data function, built and rendered under :data:`PAGE_BUILDS`;
    store errors become an error page, not JSON."""
    with PAGE_BUILDS:
        try:
            model = build()
        except ApiError as exc:
            return _error(request, exc.status, exc.message)
        return _page(request, template, model)


def _checked(build: Callable[[], T]) -> T:
    """Page parameter errors are the client's: 400 in the API's error shape."""
    try:
        return build()
    except (data.PageError, ValidationError) as exc:
        raise BadRequest(str(exc)) from exc


# ----------------------------------------------------------------------------------- static


@router.get("/static/{filename}", include_in_schema=False)
def static_file(filename: str) -> FileResponse:
    """plotly.js from the plotly package, and the page script and stylesheet."""
    if filename == PLOTLY_JS:
        path = plotly_js_path()
    elif filename in {p.name for p in STATIC_DIR.iterdir() if p.is_file()}:
        path = STATIC_DIR / filename
    else:
        raise NotFound(f"no static file {filename!r}")
    return FileResponse(path, headers={"Cache-Control": "public, max-age=3600"})


SWAGGER_UI = "/static/swagger-ui"


def swagger_ui_dir() -> Path:
    """Swagger UI 5 (it reads FastAPI's OpenAPI 3.1) as shipped in the ``fastapi-offline``
    package's ``static`` folder: no CDN. ``find_spec`` locates it without importing it."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the fastapi-offline package is not installed; /docs needs its assets")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


@router.get(SWAGGER_UI + "/{filename}", include_in_schema=False)
def swagger_ui_file(filename: str) -> FileResponse:
    """The Swagger UI script, stylesheet and icon for ``/docs``."""
    folder = swagger_ui_dir()
    if filename not in {p.name for p in folder.iterdir() if p.is_file()}:
        raise NotFound(f"no Swagger UI file {filename!r}")
    return FileResponse(folder / filename, headers={"Cache-Control": "public, max-age=3600"})


@router.get("/docs", include_in_schema=False)
def api_docs(request: Request) -> HTMLResponse:
    """The OpenAPI contract in Swagger UI, served from this app alone (works offline)."""
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url or "/openapi.json",
        title="cptrace API",
        swagger_js_url=f"{SWAGGER_UI}/swagger-ui-bundle.js",
        swagger_css_url=f"{SWAGGER_UI}/swagger-ui.css",
        swagger_favicon_url=f"{SWAGGER_UI}/favicon.png",
    )


@router.get("/", include_in_schema=False)
def home() -> RedirectResponse:
    """The dashboards start at the run list."""
    return RedirectResponse("/runs", status_code=307)


# --------------------------------------------------------------------------------------- runs

RunsQueryDep = Annotated[data.RunsQuery, Query()]
WindowQuery = Annotated[str | None, Query(max_length=200)]  # window, label or config key
MetricQuery = Annotated[str, Query(min_length=1, max_length=100)]


@router.get("/runs.json", response_model=data.RunsPage)
def runs_json(store: StoreDep, query: RunsQueryDep, _: ReadAccess) -> data.RunsPage:
    """The run list: filters, sort and page as query parameters."""
    return _checked(lambda: data.runs_page(store, query))


@router.get("/runs", response_class=HTMLResponse, include_in_schema=False)
def runs_html(request: Request, store: StoreDep, _: ReadAccess) -> Response:
    try:
        query = data.RunsQuery.model_validate(dict(request.query_params))
        page = data.runs_page(store, query)
    except (data.PageError, ValidationError) as exc:
        return _error(request, 400, str(exc))
    return _page(request, "runs.html", page, **_runs_links(request, page))


def _runs_links(request: Request, page: data.RunsPage) -> dict[str, Any]:
    """Header links that sort (toggling the order on the current column) and pager links,
    all keeping the current filters."""
    current = dict(request.query_params)

    def url(**changes: Any) -> str:
        params = {k: v for k, v in {**current, **changes}.items() if v not in (None, "")}
        return f"/runs?{urlencode(params)}" if params else "/runs"

    sort_urls = {}
    for key in data.SORT_KEYS:
        same = page.query.sort == key
        order = ("asc" if page.query.order == "desc" else "desc") if same else "desc"
        sort_urls[key] = url(sort=key, order=order, page=None)
    last_page = max(1, -(-page.total // page.query.per_page))
    return {
        "sort_urls": sort_urls,
        "prev_url": url(page=page.query.page - 1) if page.query.page > 1 else None,
        "next_url": url(page=page.query.page + 1) if page.query.page < last_page else None,
    }


@router.get("/runs/{run_id}.json", response_model=data.RunPage)
def run_json(run_id: RunId, store: StoreDep, _: ReadAccess) -> Response:
    """One run: summary, analysis report, findings and the figures of its page."""
    # The bytes are made here, in the thread pool: a returned model would be encoded on the
    # event loop, where the API's reads wait behind its ~0.7 MB.
    head = data.run_page_head(store.get_run(run_id, include_report=False))
    body = page_parts.json_twin(head, page_parts.built_page(store, run_id))
    return Response(body, media_type="application/json")


class RunPageView(data.RunPageHead):
    """What ``run.html`` renders: the run's row and its stored page (``web.page_parts``)."""

    report_html: str | None = None
    """The report's part of the page as built when it was stored (None: no report yet)."""
    figures: int = 0
    """How many charts it draws (``base.html`` loads plotly.js for any)."""


def _run_view(store: StoreDep, run_id: int) -> RunPageView:
    head = data.run_page_head(store.get_run(run_id, include_report=False))
    built = page_parts.built_page(store, run_id)
    if built is None:
        return RunPageView(**dict(head))
    return RunPageView(**dict(head), report_html=built.html, figures=built.charts)


@router.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
def run_html(run_id: RunId, request: Request, store: StoreDep, _: ReadAccess) -> Response:
    return _html(request, "run.html", lambda: _run_view(store, run_id))


# --------------------------------------------------------------------------------- comparison


@router.get("/compare", include_in_schema=False)
def compare_form(
    base: Annotated[int, Query(ge=1)], head: Annotated[int, Query(ge=1)]
) -> RedirectResponse:
    """The run list's compare form lands here; the page itself has a path per pair."""
    return RedirectResponse(data.compare_url(base, head, None, None), status_code=303)


def _compare(
    request: Request, store: StoreDep, base_id: int, head_id: int,
    base_window: str | None, head_window: str | None,
) -> data.ComparePage:  # fmt: skip
    return data.compare_page(
        store, base_id, head_id, base_window or None, head_window or None,
        link_root=str(request.base_url),
    )  # fmt: skip


@router.get("/compare/{base_id}/{head_id}.json", response_model=data.ComparePage)
def compare_json(
    base_id: RunId, head_id: RunId, request: Request, store: StoreDep, _: ReadAccess,
    base_window: WindowQuery = None, head_window: WindowQuery = None,
) -> data.ComparePage:  # fmt: skip
    """Base vs head: metric deltas with significance, per-helper deltas, verdict, figures."""
    return _compare(request, store, base_id, head_id, base_window, head_window)


@router.get("/compare/{base_id}/{head_id}", response_class=HTMLResponse, include_in_schema=False)
def compare_html(
    base_id: RunId, head_id: RunId, request: Request, store: StoreDep, _: ReadAccess,
    base_window: WindowQuery = None, head_window: WindowQuery = None,
) -> Response:  # fmt: skip
    return _html(
        request,
        "compare.html",
        lambda: _compare(request, store, base_id, head_id, base_window, head_window),
    )


# ------------------------------------------------------------------------------------ history


@router.get("/history.json", response_model=data.HistoryPage)
def history_json(
    store: StoreDep, _: ReadAccess, config_key: WindowQuery = None,
    metric: MetricQuery = "iteration_median_ms", label: WindowQuery = None,
    implementation: WindowQuery = None,
) -> data.HistoryPage:  # fmt: skip
    """One metric over the runs of one configuration and implementation, oldest first, with
    its noise band."""
    return data.history_page(store, config_key or None, metric, label, implementation or None)


@router.get("/history", response_class=HTMLResponse, include_in_schema=False)
def history_html(
    request: Request, store: StoreDep, _: ReadAccess, config_key: WindowQuery = None,
    metric: MetricQuery = "iteration_median_ms", label: WindowQuery = None,
    implementation: WindowQuery = None,
) -> Response:  # fmt: skip
    page = data.history_page(store, config_key or None, metric, label, implementation or None)
    return _page(request, "history.html", page)


# ------------------------------------------------------------------------------------ catalog


@router.get("/catalog.json", response_model=data.CatalogDescription)
def catalog_json(store: StoreDep, _: ReadAccess) -> data.CatalogDescription:
    """The helper catalog the analysis attributes kernels with."""
    return data.catalog_page(store.catalog())


@router.get("/catalog", response_class=HTMLResponse, include_in_schema=False)
def catalog_html(request: Request, store: StoreDep, _: ReadAccess) -> Response:
    return _page(request, "catalog.html", data.catalog_page(store.catalog()))


# ----------------------------------------------------------------- the pull-request loop's pages

Owner = Annotated[str, PathParam(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}$")]
Name = Annotated[str, PathParam(pattern=r"^[A-Za-z0-9._-]{1,100}$")]
Number = Annotated[int, PathParam(ge=1, le=2**31)]
ItemId = Annotated[int, PathParam(ge=1, le=2**62)]
JobsQueryDep = Annotated[loop_data.JobsQuery, Query()]


@router.get("/pulls.json", response_model=loop_data.PullsPage)
def pulls_json(store: LoopStoreDep, _: ReadAccess) -> loop_data.PullsPage:
    """Pull requests the loop measured (the verdict per suite of each newest head) and the
    newest batches."""
    return loop_data.pulls_page(store)


@router.get("/pulls", response_class=HTMLResponse, include_in_schema=False)
def pulls_html(request: Request, store: LoopStoreDep, _: ReadAccess) -> Response:
    return _page(request, "pulls.html", loop_data.pulls_page(store))


@router.get("/pulls/{owner}/{name}/{number}.json", response_model=loop_data.PullPage)
def pull_json(
    owner: Owner, name: Name, number: Number, store: LoopStoreDep, _: ReadAccess
) -> loop_data.PullPage:
    """One pull request: the verdict per suite, every batch, its runs."""
    return _checked(lambda: loop_data.pull_page(store, f"{owner}/{name}", number))


@router.get("/pulls/{owner}/{name}/{number}", response_class=HTMLResponse, include_in_schema=False)
def pull_html(
    owner: Owner, name: Name, number: Number, request: Request, store: LoopStoreDep,
    _: ReadAccess,
) -> Response:  # fmt: skip
    repo = f"{owner}/{name}"
    return _html(request, "pull.html", lambda: loop_data.pull_page(store, repo, number))


@router.get("/batches/{batch_id}.json", response_model=loop_data.BatchPage)
def batch_json(batch_id: ItemId, store: LoopStoreDep, _: ReadAccess) -> loop_data.BatchPage:
    """One batch (a commit and a suite): state, comment, jobs with runner, lease and run."""
    return loop_data.batch_page(store, batch_id)


@router.get("/batches/{batch_id}", response_class=HTMLResponse, include_in_schema=False)
def batch_html(batch_id: ItemId, request: Request, store: LoopStoreDep, _: ReadAccess) -> Response:
    return _html(request, "batch.html", lambda: loop_data.batch_page(store, batch_id))


@router.get("/jobs.json", response_model=loop_data.JobsPage)
def jobs_json(store: LoopStoreDep, query: JobsQueryDep, _: ReadAccess) -> loop_data.JobsPage:
    """Jobs, newest first (``status`` filters)."""
    return loop_data.jobs_page(store, query)


@router.get("/jobs", response_class=HTMLResponse, include_in_schema=False)
def jobs_html(request: Request, store: LoopStoreDep, _: ReadAccess) -> Response:
    try:
        query = loop_data.JobsQuery.model_validate(dict(request.query_params))
    except ValidationError as exc:
        return _error(request, 400, str(exc))
    return _page(request, "jobs.html", loop_data.jobs_page(store, query))


@router.get("/jobs/{job_id}.json", response_model=loop_data.JobPage)
def job_json(job_id: ItemId, store: LoopStoreDep, _: ReadAccess) -> loop_data.JobPage:
    """One job: state, runner, lease, attempts, reason, log tail, spec, its run and failure."""
    return loop_data.job_page(store, job_id)


@router.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
def job_html(job_id: ItemId, request: Request, store: LoopStoreDep, _: ReadAccess) -> Response:
    return _html(request, "job.html", lambda: loop_data.job_page(store, job_id))
