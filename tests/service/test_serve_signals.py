"""`cptrace serve` never leaves its analysis worker behind, however the server process ends."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from service_server import Server, group_alive, wait_for

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_worker_ends_with_the_server(tmp_path: Path, sig: signal.Signals) -> None:
    # SIGTERM: uvicorn shuts down and re-raises the signal; serve must still stop its worker.
    # SIGKILL: no code of serve runs; the worker follows its parent (PR_SET_PDEATHSIG).
    server = Server(tmp_path).start()
    try:
        assert server.proc is not None
        wait_for(lambda: "started on" in server.log.read_text(), 30, "the worker to start")
        os.kill(server.proc.pid, sig)  # the server process only, not its process group
        server.proc.wait(timeout=30)  # reap it: a zombie would keep the group "alive"
        wait_for(lambda: not group_alive(server), 30, "the worker to end with the server")
    finally:
        server.kill()
    assert "analysis worker" in server.log.read_text()
    assert "stopped" in server.log.read_text()  # it shut down, it was not killed
