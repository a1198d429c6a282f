"""Reads of the ``blobs`` table for the start-up sweep, on either backend (the rows are written
with their runs: ``service.storage.runs``)."""

from __future__ import annotations

import sqlalchemy as sa

from service.storage import schema
from service.storage.engine import Conn, execute
from service.storage.tasks import recorded_parts


def recorded_digests(conn: Conn) -> set[str]:
    """The digest of every blob a committed upload recorded, and of the per-rank parts that
    runs being analysed still need (``tasks.recorded_parts``)."""
    uploaded = {r["sha256"] for r in execute(conn, sa.select(schema.blobs.c.sha256)).rows}
    return uploaded | recorded_parts(conn)
