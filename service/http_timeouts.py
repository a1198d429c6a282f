"""Slow clients cannot hold connections forever: a header and a body timeout for uvicorn.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits without end for a
request's headers and for the next piece of its body. ``TimedH11Protocol`` adds both:

- headers: from the connection's first byte (or the end of the previous response) the client
  has ``http_header_timeout_s`` to complete the request line and headers; trickling one byte a
  second does not reset it (slowloris);
- body: while the request body is arriving, a pause longer than ``http_body_timeout_s`` closes
  the connection. A pause caused by the server itself (flow control while the app is busy) does
  not count.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.core.config import Settings


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body timeouts (class attributes, see below)."""

    header_timeout_s = 10.0
    body_timeout_s = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._cancel_timers()  # keep-alive's own timer runs until the next request begins

    def _track(self) -> None:
        state = self.conn.their_state
        if state is h11.IDLE:
            self._arm_header_timer()  # (no-op when already armed: trickling does not reset it)
        else:
            self._cancel(self._header_timer)
            self._header_timer = None
        if state is h11.SEND_BODY:
            self._cancel(self._body_timer)
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._on_body_timeout)
        else:
            self._cancel(self._body_timer)
            self._body_timer = None

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_timeout)

    def _on_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE:  # still no complete request line and headers
            self._close()

    def _on_body_timeout(self) -> None:
        self._body_timer = None
        if self.conn.their_state is not h11.SEND_BODY:
            return
        if self.flow.read_paused:  # the server is not reading: not the client's fault
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._on_body_timeout)
            return
        self._close()

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _cancel_timers(self) -> None:
        self._cancel(self._header_timer)
        self._cancel(self._body_timer)
        self._header_timer = self._body_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()


def timed_protocol(settings: Settings) -> type[TimedH11Protocol]:
    """A protocol class with this server's timeouts (uvicorn takes a class, not an instance)."""
    return type(
        "CptraceH11Protocol",
        (TimedH11Protocol,),
        {
            "header_timeout_s": settings.http_header_timeout_s,
            "body_timeout_s": settings.http_body_timeout_s,
        },
    )
