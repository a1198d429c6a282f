"""Webhook deliveries: the signature check and the replay guard.

GitHub signs the raw body with the webhook secret (HMAC-SHA256, ``X-Hub-Signature-256:
sha256=<hex>``). The check runs on the exact bytes received, before any parsing, and compares
in constant time (``hmac.compare_digest``), so the answer's timing says nothing about how much
of a forged signature was right. Each delivery carries a GUID (``X-GitHub-Delivery``) that a
redelivery repeats: it is recorded (``service.storage.deliveries``) in the same transaction that
queues the jobs, so a replay queues nothing.
"""

from __future__ import annotations

import hashlib
import hmac

_PREFIX = "sha256="


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is the HMAC-SHA256 of ``body`` under ``secret``."""
    if not header or not header.startswith(_PREFIX):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header[len(_PREFIX) :].strip().encode())
