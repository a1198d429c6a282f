"""Slow clients cannot hold connections forever: a header and a body timeout for uvicorn.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits without end for a
request's headers and for the next piece of its body. ``TimedHttpToolsProtocol`` adds both:

- headers: from the connection's first byte (or the end of the previous response) the client
  has ``http_header_timeout_s`` to complete the request line and headers; trickling one byte a
  second does not reset it (slowloris). The request line and headers may take at most
  ``max_head_bytes`` (64 KiB, what the h11 protocol allowed): more is answered 400 and closed.
- body: while the request body is arriving, a pause longer than ``http_body_timeout_s`` closes
  the connection. A pause caused by the server itself (flow control while the app is busy) does
  not count. A trickle does not extend it either: after its first ``http_body_timeout_s`` a body
  must have averaged at least ``http_body_min_bytes_per_s`` (time the server itself was not
  reading excepted), else the connection is closed.
- refusals: a response sent before the request's body arrived (401, 403, 413, ...) closes the
  connection; the rest of the body is never read (a client trickling a body after its 401
  holds nothing).
- connections: at most ``http_max_connections`` open at once; one more is answered 503 with
  ``Retry-After`` and closed at once, so idle and trickling sockets cannot take every file
  descriptor.

It is uvicorn's httptools protocol (llhttp, C), not its h11 one (pure Python): parsing a 4.7 MB
upload body costs ~0.4 ms of CPU there against ~6 ms in h11.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.core.config import Settings

MAX_HEAD_BYTES = 64 * 1024
"""Longest request line plus headers accepted (bytes)."""
BODY_RATE_TICK_S = 1.0
"""How often the body's average rate is checked (seconds; at most the body timeout)."""
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 5\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_BUSY_BODY = (
    b'{"ok": false, "error": "the server has too many open connections; retry", '
    b'"errors": [], "status": 503}'
)


class _Phase(enum.Enum):
    IDLE = "idle"  # between requests (or before the first byte)
    HEAD = "head"  # request line and headers arriving
    BODY = "body"  # body arriving
    DONE = "done"  # request complete, response pending


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body timeouts (class attributes, see below)."""

    header_timeout_s = 10.0
    body_timeout_s = 60.0
    body_min_bytes_per_s = 65536
    max_connections = 512
    max_head_bytes = MAX_HEAD_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _Phase.IDLE
        self._head_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._rate_timer: asyncio.TimerHandle | None = None
        self._body_bytes = 0
        self._body_clock = 0.0  # seconds of this body counted against the client

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            body = _BUSY_BODY
            transport.write(_BUSY_RESPONSE % (len(body), body))
            transport.close()
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase in (_Phase.IDLE, _Phase.HEAD):
            self._head_bytes += len(data)  # an upper bound: may include the body's first bytes
        super().data_received(data)
        self._track()

    # parser callbacks (httptools calls them from ``feed_data``)
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _Phase.HEAD

    def on_headers_complete(self) -> None:
        self._phase = _Phase.BODY
        self._head_bytes = 0
        self._body_bytes = 0
        self._body_clock = 0.0
        self._cancel(self._rate_timer)
        self._rate_timer = self.loop.call_later(self._tick_s, self._on_rate_tick)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _Phase.DONE

    def on_response_complete(self) -> None:
        refused_early = self._phase is _Phase.BODY  # answered before its body arrived
        super().on_response_complete()
        self._cancel_timers()  # keep-alive's own timer runs until the next request begins
        if refused_early:
            self._close()  # the rest of the body is never read (a trickle after a 401)
        elif self._phase is _Phase.DONE:
            self._phase = _Phase.IDLE

    def _track(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self._phase in (_Phase.IDLE, _Phase.HEAD):
            if self._head_bytes > self.max_head_bytes:
                self._cancel_timers()
                self.send_400_response("Invalid HTTP request received.")
                return
            self._arm_header_timer()  # (no-op when already armed: trickling does not reset it)
        else:
            self._cancel(self._header_timer)
            self._header_timer = None
        if self._phase is _Phase.BODY:
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
        if self._phase in (_Phase.IDLE, _Phase.HEAD):  # still no complete request line + headers
            self._close()

    def _on_body_timeout(self) -> None:
        self._body_timer = None
        if self._phase is not _Phase.BODY:
            return
        if self.flow.read_paused:  # the server is not reading: not the client's fault
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._on_body_timeout)
            return
        self._close()

    @property
    def _tick_s(self) -> float:
        return min(BODY_RATE_TICK_S, self.body_timeout_s)

    def _on_rate_tick(self) -> None:
        """A body must average ``body_min_bytes_per_s`` after its first ``body_timeout_s``:
        time the server was not reading (flow control) is not counted against the client."""
        self._rate_timer = None
        if self._phase is not _Phase.BODY or self.transport.is_closing():
            return
        if not self.flow.read_paused:
            self._body_clock += self._tick_s
        owed = (self._body_clock - self.body_timeout_s) * self.body_min_bytes_per_s
        if owed > self._body_bytes:
            self._close()
            return
        self._rate_timer = self.loop.call_later(self._tick_s, self._on_rate_tick)

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _cancel_timers(self) -> None:
        self._cancel(self._header_timer)
        self._cancel(self._body_timer)
        self._cancel(self._rate_timer)
        self._header_timer = self._body_timer = self._rate_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()


def timed_protocol(settings: Settings) -> type[TimedHttpToolsProtocol]:
    """A protocol class with this server's timeouts (uvicorn takes a class, not an instance)."""
    return type(
        "CptraceHttpProtocol",
        (TimedHttpToolsProtocol,),
        {
            "header_timeout_s": settings.http_header_timeout_s,
            "body_timeout_s": settings.http_body_timeout_s,
            "body_min_bytes_per_s": settings.http_body_min_bytes_per_s,
            "max_connections": settings.http_max_connections,
        },
    )
