"""The analysis worker as served: ``service.worker`` with the pages' after-store hook.

The composition root of the worker process (``cptrace.app`` is the API's): ``service`` may not
import ``web``, so this module, above both, hands the worker ``web.page_parts.store_built``,
which builds each run's page when its report is stored. ``cptrace serve`` supervises
``python -m cptrace.worker``; ``cptrace worker`` runs :func:`main`.
"""

from __future__ import annotations

from service import worker
from service.core.config import Settings
from web.page_parts import store_built


def main(settings: Settings, *, once: bool = False) -> None:
    """Run the worker (``service.worker.main``) with the pages built as reports are stored."""
    worker.main(settings, once=once, on_stored=store_built)


if __name__ == "__main__":
    worker.cli(on_stored=store_built)
