"""Every statement on ``github_deliveries``, on either backend: the webhook deliveries seen
(a replayed delivery id is answered from its stored outcome, never acted on twice)."""

from __future__ import annotations

import sqlalchemy as sa

from service.auth import now_iso
from service.storage import schema
from service.storage.engine import Conn, execute, insert_for

_d = schema.github_deliveries

OUTCOME_CHARS = 2000
"""A stored outcome is cut to this length."""


def record_delivery(conn: Conn, delivery_id: str, event: str, action: str | None) -> bool:
    """Record a delivery id; False when it was seen before (a replay). The caller holds the
    transaction."""
    insert = insert_for(conn, _d).values(
        delivery_id=delivery_id, event=event, action=action, received_at=now_iso()
    )
    found = execute(conn, insert.on_conflict_do_nothing().returning(_d.c.delivery_id)).rows
    return len(found) == 1


def set_outcome(conn: Conn, delivery_id: str, outcome: str) -> None:
    update = sa.update(_d).where(_d.c.delivery_id == delivery_id)
    execute(conn, update.values(outcome=outcome[:OUTCOME_CHARS]))


def delivery_outcome(conn: Conn, delivery_id: str) -> str | None:
    """The stored outcome of a delivery ("" while it is handled), or None when never seen."""
    found = execute(conn, sa.select(_d.c.outcome).where(_d.c.delivery_id == delivery_id)).rows
    return None if not found else (found[0]["outcome"] or "")


def forget_delivery(conn: Conn, delivery_id: str) -> None:
    """Forget a delivery, so that GitHub's redelivery of it is not taken for a replay."""
    execute(conn, sa.delete(_d).where(_d.c.delivery_id == delivery_id))
