"""Reading a webhook body before anyone is authenticated: bounded in bytes, count and time.

A webhook delivery carries no bearer token; only its HMAC says who sent it, and the HMAC needs
the whole body. So the body is streamed into a spooled file (memory up to ``SPOOL_BYTES``, then
disk) with the HMAC computed as it arrives, under three limits that hold before the signature is
known (``LoopSettings``, docs/github.md "Limits"):

* ``max_payload_bytes`` per body (``Content-Length`` over it is refused before reading: 413);
* ``webhook_max_bodies`` bodies being received at once and ``webhook_max_inflight_bytes`` held
  by them together: over either, 503 with ``Retry-After`` (GitHub redelivers);
* ``webhook_body_deadline_s`` for the whole body, however slowly it trickles: 408.

A request without a well-formed ``X-Hub-Signature-256`` header is refused before its body is
read at all. Every refusal closes the connection (``Connection: close``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import tempfile
from dataclasses import dataclass
from typing import IO

from fastapi import Request

from service.core.errors import ApiError, PayloadTooLarge, Unauthorized

SPOOL_BYTES = 256 * 1024
_PREFIX = "sha256="
_CLOSE = {"Connection": "close"}


class BodyTimeout(ApiError):
    """The whole body did not arrive within the deadline."""

    status = 408


class WebhookBusy(ApiError):
    """Too many unauthenticated bodies (or bytes) in flight; GitHub redelivers."""

    status = 503


@dataclass(slots=True)
class BodyGate:
    """What unauthenticated bodies hold right now (one per app; the event loop is its lock)."""

    max_bodies: int
    max_bytes: int
    bodies: int = 0
    held: int = 0


def gate_for(request: Request, *, max_bodies: int, max_bytes: int) -> BodyGate:
    """The app's gate (made on first use, resized when the settings change)."""
    gate: BodyGate | None = getattr(request.app.state, "webhook_gate", None)
    if gate is None:
        gate = BodyGate(max_bodies, max_bytes)
        request.app.state.webhook_gate = gate
    gate.max_bodies, gate.max_bytes = max_bodies, max_bytes
    return gate


def _refuse(error: ApiError, **headers: str) -> ApiError:
    error.headers = {**_CLOSE, **headers}
    return error


async def read_signed_body(
    request: Request, *, secret: str, limit: int, gate: BodyGate, deadline_s: float
) -> IO[bytes]:
    """The body (a spooled file at offset 0) once its HMAC matches the signature header.

    :raises Unauthorized: no or a wrong signature; :raises PayloadTooLarge: over ``limit``;
        :raises WebhookBusy: the gate is full; :raises BodyTimeout: the deadline passed.
    """
    header = request.headers.get("x-hub-signature-256") or ""
    if not header.startswith(_PREFIX) or len(header) != len(_PREFIX) + 64:
        raise _refuse(Unauthorized("X-Hub-Signature-256 is missing or malformed"))
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _refuse(PayloadTooLarge(f"webhook body larger than {limit} bytes"))
    if gate.bodies >= gate.max_bodies or gate.held >= gate.max_bytes:
        raise _refuse(
            WebhookBusy("too many webhook bodies in flight; retry later"), **{"Retry-After": "5"}
        )
    gate.bodies += 1
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (returned)
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    size = 0
    try:
        async with asyncio.timeout(deadline_s):
            async for chunk in request.stream():
                size += len(chunk)
                gate.held += len(chunk)
                if size > limit:
                    raise _refuse(PayloadTooLarge(f"webhook body larger than {limit} bytes"))
                if gate.held > gate.max_bytes:
                    raise _refuse(
                        WebhookBusy("webhook bodies in flight hold too many bytes; retry later"),
                        **{"Retry-After": "5"},
                    )
                mac.update(chunk)
                spool.write(chunk)
    except TimeoutError:
        spool.close()
        raise _refuse(BodyTimeout(f"the webhook body took longer than {deadline_s} s")) from None
    except BaseException:
        spool.close()
        raise
    finally:
        gate.bodies -= 1
        gate.held -= size
    if not hmac.compare_digest(mac.hexdigest().encode(), header[len(_PREFIX) :].encode()):
        spool.close()
        raise _refuse(Unauthorized("X-Hub-Signature-256 does not match the body"))
    spool.seek(0)
    return spool
