"""Two uploads of one token at once cannot pass its stored-bytes quota together: the quota is
checked again when the run is inserted, in the insert's write transaction (issue 24, item 4).

Against a real ``cptrace serve``: both uploads send their headers and half their body, so
both pass the check made before a body is read, then both finish. One run is stored, the other
answer is a 413 that names the quota, and the refused upload leaves no blob behind.
"""

from __future__ import annotations

import io
import socket
import sqlite3
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_factories import kineto_bundle
from service_server import Server


def _stored_size(bundle: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return sum(m.size for m in tar.getmembers())


@pytest.fixture
def bundles() -> tuple[bytes, bytes]:
    return kineto_bundle(name="a", salt="race-1"), kineto_bundle(name="b", salt="race-2")


@pytest.fixture
def server(tmp_path: Path, bundles: tuple[bytes, bytes]) -> Iterator[Server]:
    quota = _stored_size(bundles[0]) * 3 // 2  # one bundle fits, two do not
    env = {"CPTRACE_TOKEN_STORED_QUOTA_BYTES": str(quota)}
    srv = Server(tmp_path, worker=False, env=env).start()
    try:
        yield srv
    finally:
        srv.stop()


def _begin(server: Server, body: bytes) -> socket.socket:
    """An upload whose headers and first half of the body are sent; the rest is not."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    head = (
        "POST /api/v1/uploads/bundles HTTP/1.1\r\nHost: test\r\n"
        f"Authorization: {server.headers['Authorization']}\r\n"
        "Content-Type: application/gzip\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + body[: len(body) // 2])
    return sock


def _finish(sock: socket.socket, body: bytes) -> tuple[int, str]:
    sock.sendall(body[len(body) // 2 :])
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    head, _, text = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), text.decode()


def test_two_concurrent_uploads_cannot_pass_the_token_quota(
    server: Server, bundles: tuple[bytes, bytes]
) -> None:
    socks = [_begin(server, body) for body in bundles]
    time.sleep(1.0)  # both requests are past the check made before their bodies are read
    answers = [_finish(sock, body) for sock, body in zip(socks, bundles, strict=True)]
    statuses = sorted(status for status, _ in answers)
    assert statuses == [201, 413], answers
    refused = next(text for status, text in answers if status == 413)
    assert "quota" in refused and "CPTRACE_TOKEN_STORED_QUOTA_BYTES" in refused, refused
    conn = sqlite3.connect(server.data_dir / "cptrace.db")
    try:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM uploads").fetchone()[0] == 1
        referenced = {r[0] for r in conn.execute("SELECT sha256 FROM run_files")}
        assert {r[0] for r in conn.execute("SELECT sha256 FROM blobs")} == referenced
    finally:
        conn.close()
    files = {p.parent.name + p.name for p in (server.data_dir / "blobs").glob("*/*")}
    assert files == referenced  # the refused upload's own blob (its manifest) is gone
