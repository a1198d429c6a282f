"""A real S3-compatible server for the tests: moto's standalone server (``python -m moto.server``)
in a subprocess on a free loopback port, spoken to over HTTP by boto3 like any S3 endpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from testkit import free_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "cptrace-test",
    "AWS_SECRET_ACCESS_KEY": "cptrace-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""What boto3's chain reads in the tests (moto accepts any key)."""


@contextmanager
def moto_server(log_dir: Path, timeout: float = 60) -> Iterator[str]:
    """Start the server; yields its endpoint URL; stops it afterwards."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (log_dir / f"moto-{port}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **CREDENTIALS},
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited: {(log_dir / log.name).read_text()}")
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def new_bucket_name() -> str:
    """A bucket of its own for one test (the server is shared by the session)."""
    return f"cptrace-{uuid.uuid4().hex[:20]}"
