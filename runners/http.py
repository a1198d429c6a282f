"""A small HTTP client for the cptrace service, on the standard library only.

Runners live on GPU hosts that have torch but not httpx or FastAPI, so this uses
``urllib.request``. It knows the two things the runner API needs: JSON calls and a streamed
multipart upload, both with bounded retries (exponential backoff with jitter) on connection
errors, 429 and 5xx. A 4xx is final: retrying a bad request cannot fix it.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

API_PREFIX = "/api/v1"
_CHUNK = 1024 * 1024
T = TypeVar("T")


class ApiError(RuntimeError):
    """The service answered with an error status (or could not be reached, status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status

    @property
    def retryable(self) -> bool:
        """Connection failures, 429 and 5xx may succeed later; other 4xx never will."""
        return self.status == 0 or self.status == 429 or self.status >= 500


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Bounded exponential backoff: ``base_s * 2**attempt``, capped, with +-25 % jitter."""

    attempts: int = 5
    base_s: float = 0.5
    max_s: float = 10.0

    def delay(self, attempt: int) -> float:
        raw = min(self.max_s, self.base_s * 2**attempt)
        return float(raw * random.uniform(0.75, 1.25))


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: Any
    """Decoded JSON, or None for an empty body (204)."""


def with_retries(
    call: Callable[[], T], policy: RetryPolicy, *, sleep: Callable[[float], None] = time.sleep
) -> T:
    """Run ``call`` until it succeeds, raises a final error, or the attempts run out."""
    for attempt in range(policy.attempts):
        try:
            return call()
        except ApiError as exc:
            if not exc.retryable or attempt == policy.attempts - 1:
                raise
            sleep(policy.delay(attempt))
    raise AssertionError("unreachable: the loop returns or raises")


def _error_message(err: urllib.error.HTTPError) -> str:
    try:
        raw = err.read()
    except OSError:
        raw = b""
    return _message_from_body(raw, err.reason if isinstance(err.reason, str) else str(err.reason))


def _message_from_body(raw: bytes, reason: str) -> str:
    """The service's ``error`` field when the body is its JSON error shape, else ``reason``."""
    try:
        body = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return reason
    if isinstance(body, dict):
        return str(body.get("error") or body.get("detail") or body)
    return str(body)


class ServiceClient:
    """Authenticated calls to ``<server>/api/v1``. The token never appears in messages."""

    def __init__(self, server: str, token: str, *, timeout_s: float = 60.0) -> None:
        parsed = urllib.parse.urlparse(server)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"server must be an http(s) URL, got {server!r}")
        if not token:
            raise ValueError("a token is needed (CPTRACE_TOKEN or a token file)")
        self.base = server.rstrip("/") + API_PREFIX
        self._token = token
        self.timeout_s = timeout_s

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values that must never leave this host in a text (``contracts.redaction``)."""
        return (self._token,)

    def _send(self, req: urllib.request.Request, timeout: float | None = None) -> Response:
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, _error_message(err)) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ApiError(0, f"cannot reach {self.base}: {reason}") from None
        body = json.loads(raw) if raw.strip() else None
        return Response(status, body)

    def post_json(
        self, path: str, payload: dict[str, Any], *, timeout: float | None = None
    ) -> Response:
        """POST a JSON body (one attempt; wrap in ``with_retries`` where a retry is safe)."""
        req = urllib.request.Request(
            self.base + path,
            data=json.dumps(payload).encode("utf-8"),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        return self._send(req, timeout)

    def post_file(
        self, path: str, *, field: str, file: Path, headers: dict[str, str] | None = None
    ) -> Response:
        """POST ``file`` as multipart form field ``field``, streamed (never read whole)."""
        boundary = f"cptrace-{uuid.uuid4().hex}"
        head = (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="{field}"; filename="{file.name}"\r\n'
            "Content-Type: application/gzip\r\n\r\n"
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()

        def body() -> Iterator[bytes]:
            yield head
            with file.open("rb") as fh:
                while chunk := fh.read(_CHUNK):
                    yield chunk
            yield tail

        length = len(head) + file.stat().st_size + len(tail)
        return self._post_streamed(
            path,
            {
                "Content-Type": f"multipart/form-data; boundary={boundary}",
                "Content-Length": str(length),
                **(headers or {}),
            },
            body(),
        )

    def post_body(
        self,
        path: str,
        *,
        file: Path,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """POST ``file`` itself as the body, streamed (no multipart framing to write or parse)."""

        def body() -> Iterator[bytes]:
            with file.open("rb") as fh:
                while chunk := fh.read(_CHUNK):
                    yield chunk

        return self._post_streamed(
            path,
            {
                "Content-Type": content_type,
                "Content-Length": str(file.stat().st_size),
                **(headers or {}),
            },
            body(),
        )

    def _post_streamed(
        self, path: str, headers: dict[str, str], chunks: Iterator[bytes]
    ) -> Response:
        """POST a streamed body and read the answer even when the server stopped reading.

        A server may answer early (401 for a bad token, 413 for a body over its limit) and
        close the connection before the body is through; the client then sees a broken pipe
        while sending. That answer is final, so read it rather than report a network failure
        that the caller would retry.
        """
        url = urllib.parse.urlsplit(self.base + path)
        connection_class = (
            http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        )
        conn = connection_class(url.hostname or "", url.port, timeout=self.timeout_s)
        send_error: OSError | None = None
        try:
            try:
                conn.putrequest("POST", url.path + (f"?{url.query}" if url.query else ""))
                for name, value in {
                    **headers,
                    "Authorization": f"Bearer {self._token}",
                    "Accept": "application/json",
                }.items():
                    conn.putheader(name, value)
                conn.endheaders()
                for chunk in chunks:
                    conn.send(chunk)
            except (BrokenPipeError, ConnectionResetError) as err:
                send_error = err  # maybe an early answer is waiting: read it below
            try:
                resp = conn.getresponse()
                raw, status, reason = resp.read(), resp.status, resp.reason
            except (http.client.HTTPException, OSError) as err:
                cause = send_error or err
                raise ApiError(0, f"cannot reach {self.base}: {cause}") from None
        except OSError as err:  # could not connect at all
            raise ApiError(0, f"cannot reach {self.base}: {err}") from None
        finally:
            conn.close()
        if status >= 400:
            raise ApiError(status, _message_from_body(raw, reason))
        return Response(status, json.loads(raw) if raw.strip() else None)
