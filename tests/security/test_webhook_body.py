"""The webhook reads unauthenticated bodies under a byte cap, a concurrency cap and a deadline a
trickle cannot extend, and closes the connection on every refusal (issue 24, items 3 and 10).

A real ``cptrace serve`` on loopback, raw sockets for the slow and oversized clients.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_github import sign
from service_server import Server

SECRET = "webhook-secret-for-body-tests"
DEADLINE_S = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("webhook-body")
    env = {
        "CPTRACE_GITHUB_WEBHOOK_SECRET": SECRET,
        "CPTRACE_GITHUB_WEBHOOK_MAX_BODIES": "2",
        "CPTRACE_GITHUB_WEBHOOK_BODY_DEADLINE_S": str(DEADLINE_S),
        "CPTRACE_GITHUB_MAX_PAYLOAD_BYTES": str(64 * 1024),
        "GITHUB_TOKEN": "",
    }
    srv = Server(Path(data), worker=False, env=env).start()
    yield srv
    srv.stop()


def _open(
    server: Server, *, length: int, signature: str | None, event: str = "ping"
) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    lines = [
        "POST /api/v1/github/webhook HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        f"X-GitHub-Event: {event}",
        "X-GitHub-Delivery: d-" + str(time.monotonic_ns()),
    ]
    if signature is not None:
        lines.append(f"X-Hub-Signature-256: {signature}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def _answer(sock: socket.socket) -> tuple[int, str, bool]:
    """Status line code, the raw head + body, and whether the server then closed the socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length:")), 0,
    )  # fmt: skip
    while len(rest) < length:
        rest += sock.recv(65536)
    sock.settimeout(5)
    try:
        closed = sock.recv(1) == b""
    except (TimeoutError, ConnectionResetError):
        closed = False
    status = int(head.split(b" ")[1]) if head else 0
    return status, (head + b"\r\n\r\n" + rest).decode(errors="replace"), closed


def test_no_signature_is_refused_before_the_body(server: Server) -> None:
    sock = _open(server, length=60_000, signature=None)  # and no body sent at all
    status, text, closed = _answer(sock)
    assert status == 401 and "X-Hub-Signature-256" in text and closed


def test_declared_size_over_the_cap_is_refused_unread(server: Server) -> None:
    sock = _open(server, length=10**9, signature="sha256=" + "0" * 64)
    status, _, closed = _answer(sock)
    assert status == 413 and closed


def test_a_trickle_cannot_outlast_the_deadline(server: Server) -> None:
    sock = _open(server, length=1000, signature="sha256=" + "0" * 64)
    started = time.monotonic()
    sock.settimeout(0.25)
    answered = b""
    while time.monotonic() - started < 10 and not answered:
        try:
            sock.sendall(b" ")
            answered = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    elapsed = time.monotonic() - started
    assert answered.startswith(b"HTTP/1.1 408"), answered
    assert elapsed < DEADLINE_S + 3, f"answered after {elapsed:.1f} s"


def test_concurrent_unauthenticated_bodies_are_capped(server: Server) -> None:
    slow = [_open(server, length=1000, signature="sha256=" + "0" * 64) for _ in range(2)]
    try:
        for sock in slow:
            sock.sendall(b"{")
        time.sleep(0.3)
        third = _open(server, length=2, signature="sha256=" + "0" * 64)
        third.sendall(b"{}")
        status, text, closed = _answer(third)
        assert status == 503 and "retry-after: 5" in text.lower() and closed
    finally:
        for sock in slow:
            sock.close()


def test_a_signed_delivery_still_works_and_a_forged_one_closes(server: Server) -> None:
    time.sleep(DEADLINE_S + 0.5)  # the previous test's slow bodies are gone by now
    body = json.dumps({"zen": "Keep it logically awesome."}).encode()
    good = _open(server, length=len(body), signature=sign(SECRET, body))
    good.sendall(body)
    status, text, _ = _answer(good)
    assert status == 200, text
    forged = _open(server, length=len(body), signature="sha256=" + "1" * 64)
    forged.sendall(body)
    status, _, closed = _answer(forged)
    assert status == 401 and closed
