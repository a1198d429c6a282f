"""Webhook deliveries: the signature check and the replay guard.

GitHub signs the raw body with the webhook secret (HMAC-SHA256, ``X-Hub-Signature-256:
sha256=<hex>``). The check runs on the exact bytes received, before any parsing, and compares
in constant time (``hmac.compare_digest``), so the answer's timing says nothing about how much
of a forged signature was right. Each delivery carries a GUID (``X-GitHub-Delivery``) that a
redelivery repeats: it is recorded in the same transaction that queues the jobs, so a replay
queues nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import sqlite3

from service.auth import now_iso

_PREFIX = "sha256="


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is the HMAC-SHA256 of ``body`` under ``secret``."""
    if not header or not header.startswith(_PREFIX):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header[len(_PREFIX) :].strip().encode())


def record_delivery(
    conn: sqlite3.Connection, delivery_id: str, event: str, action: str | None
) -> bool:
    """Record a delivery id; False when it was seen before (a replay). Caller holds the
    transaction."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO github_deliveries (delivery_id, event, action, received_at)"
        " VALUES (?, ?, ?, ?)",
        (delivery_id, event, action, now_iso()),
    )
    return cur.rowcount == 1


def set_outcome(conn: sqlite3.Connection, delivery_id: str, outcome: str) -> None:
    conn.execute(
        "UPDATE github_deliveries SET outcome = ? WHERE delivery_id = ?",
        (outcome[:2000], delivery_id),
    )


def delivery_outcome(conn: sqlite3.Connection, delivery_id: str) -> str | None:
    row = conn.execute(
        "SELECT outcome FROM github_deliveries WHERE delivery_id = ?", (delivery_id,)
    ).fetchone()
    return None if row is None else (row[0] or "")
