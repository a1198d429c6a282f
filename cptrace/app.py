"""The composition root: the one place where the served app is assembled from its rooms.

``service.main.create_app`` builds the JSON API (database, blobs, API routers, error handler);
the dashboards (``web.routes.router``, which carries the PR-comment endpoint) are included here,
above both, so ``service`` never imports ``web`` and ``web`` never builds the service. The
supervised analysis worker runs ``cptrace.worker``: the worker with the pages' after-store hook.
"""

from __future__ import annotations

from fastapi import FastAPI

from service.core.config import Settings
from service.main import create_app as create_api
from web.routes import router as web_router


def create_app(settings: Settings | None = None) -> FastAPI:
    """The cptrace app: the JSON API under ``/api/v1`` plus the dashboard pages."""
    app = create_api(settings)
    app.include_router(web_router)
    app.state.worker_module = "cptrace.worker"  # the worker with the pages' after-store hook
    return app
