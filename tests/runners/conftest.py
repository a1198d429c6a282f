"""Runner test fixtures: the real service on loopback (uvicorn), a scriptable fake, bundles."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from runner_fixtures import FakeService, LiveService
from testkit import free_port

from runners.bundle import add_trace, finalize_bundle, run_info, trace_entry


@contextlib.contextmanager
def _serve(data_dir: Path) -> Iterator[LiveService]:
    """The real FastAPI service under uvicorn on 127.0.0.1 (a free port), with role tokens."""
    import uvicorn

    from cptrace.app import create_app
    from service.auth import Role, create_token
    from service.core.config import Settings

    settings = Settings(
        data_dir=data_dir, ingest_workers=0, job_lease_s=5.0, claim_max_wait_s=2.0
    )
    app = create_app(settings)
    db = app.state.db
    tokens = {r.value: db.write_tx(lambda c, r=r: create_token(c, role=r)) for r in Role}
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield LiveService(url=f"http://127.0.0.1:{port}", tokens=tokens, app=app)
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """One real service for a whole module (uploads are idempotent, so sharing is safe)."""
    with _serve(tmp_path_factory.mktemp("service")) as service:
        yield service


@pytest.fixture()
def fresh_service(tmp_path: Path) -> Iterator[LiveService]:
    """A real service with an empty job queue, for tests that claim jobs."""
    with _serve(tmp_path / "service") as service:
        yield service


@pytest.fixture()
def fake_service() -> Iterator[FakeService]:
    """``http.server`` on a free loopback port; ``fake.handler`` decides every answer."""
    fake = FakeService()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            fake.calls.append((self.path, headers, body))
            assert fake.handler is not None
            status, payload = fake.handler(self.path, headers, body)
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def synthetic_bundle(tmp_path: Path, data_dir: Path) -> Path:
    """A real bundle directory around the synthetic H200 Kineto traces."""
    root = tmp_path / "synthetic"
    root.mkdir()
    entries = [
        trace_entry(
            add_trace(root, data_dir / "synthetic-h200x2" / f"kineto_rank{r}.json.gz"),
            fmt="kineto", rank=r,
        )
        for r in (0, 1)
    ]
    finalize_bundle(
        root,
        run=run_info(name="synthetic", spec={}, created_at=None),
        traces=entries, workload={}, variants=[], environment={},
    )
    return root
