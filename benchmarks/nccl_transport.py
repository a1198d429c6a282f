"""Transport facts and point-to-point bandwidth between two ranks of one host.

Why: the bundled CP attention's ring step is bounded by how fast one rank's KV (or dK/dV) reaches
its peer. The last 2x H200 measurement saw ~77 GB/s per direction through NCCL send/recv where
NVLink moves several times that, so before tuning the ring we need to know which transport NCCL
picked (P2P/IPC, P2P/CUMEM, SHM, NET), whether CUDA IPC works between the two processes, and what
each way of moving bytes achieves for the message sizes the ring sends (1-128 MB).

Methods, each timed for ``--iters`` repetitions after a warm-up, both directions at once (as in
the ring: every rank sends to its next peer and receives from its previous one):

* ``send/recv``: ``dist.send`` / ``dist.recv`` ordered by rank parity (even sends first);
* ``batched isend/irecv``: one ``dist.batch_isend_irecv`` with both operations;
* ``peer copy (CE)``: CUDA only; the peer's receive buffer is mapped into this process through a
  CUDA IPC handle and filled with ``Tensor.copy_`` on a side stream (a copy-engine transfer,
  no SMs), ranks synchronised with a barrier around each timed batch.

Bandwidth is bytes moved in one direction divided by the median time per transfer. NCCL's
``NCCL_DEBUG=INFO`` / ``NCCL_DEBUG_SUBSYS=INIT,P2P`` lines naming a channel's transport are
collected from per-rank debug files and summarised.

Run on a 2-GPU host: ``NCCL_NVLS_ENABLE=0 PYTHONPATH=. python benchmarks/nccl_transport.py``;
``--cpu`` runs the same measurement with gloo on the CPU (smoke run; no transport facts).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TRANSPORT_RE = re.compile(r"via (P2P/CUMEM/read|P2P/CUMEM|P2P/IPC/read|P2P/IPC|P2P/direct pointer|"
                          r"SHM/direct/direct|SHM|NET/\S+|COLLNET)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, iters: int, device: torch.device) -> list[float]:
    """Seconds per call of ``fn``; a barrier before each call starts both ranks together."""
    fn()
    _sync(device)
    times = []
    for _ in range(iters):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def _send_recv(rank: int, peer: int, send: torch.Tensor, recv: torch.Tensor):
    def step() -> None:
        if rank % 2 == 0:
            dist.send(send, peer)
            dist.recv(recv, peer)
        else:
            dist.recv(recv, peer)
            dist.send(send, peer)
    return step


def _batched(peer: int, send: torch.Tensor, recv: torch.Tensor):
    def step() -> None:
        ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return step


def _peer_copy(peer: int, send: torch.Tensor, recv: torch.Tensor):
    """Map the peer's ``recv`` through CUDA IPC and write ``send`` into it with the copy engine."""
    from torch.multiprocessing.reductions import reduce_tensor

    rebuild, args = reduce_tensor(recv)
    handles: list[object] = [None, None]
    dist.all_gather_object(handles, (rebuild, args))
    fn, fn_args = handles[peer]  # type: ignore[misc]
    remote = fn(*fn_args)  # opens the peer's allocation in this process (cudaIpcOpenMemHandle)
    stream = torch.cuda.Stream(device=send.device)

    def step() -> None:
        with torch.cuda.stream(stream):
            remote.copy_(send, non_blocking=True)
        stream.synchronize()
    return step


def _transport_lines(debug_dir: Path) -> Counter[str]:
    found: Counter[str] = Counter()
    for f in debug_dir.glob("nccl.*"):
        for line in f.read_text(errors="replace").splitlines():
            m = TRANSPORT_RE.search(line)
            if m:
                found[m.group(1)] += 1
    return found


def _worker(rank: int, world: int, port: int, opts: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cpu = opts.cpu
    device = torch.device("cpu") if cpu else torch.device("cuda", rank)
    if not cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if cpu else "nccl", rank=rank, world_size=world,
                            device_id=None if cpu else device)
    peer = 1 - rank
    rows = []
    for mb in opts.sizes_mb:
        n = int(mb * 2**20) // 2
        send = torch.ones(n, dtype=torch.bfloat16, device=device)
        recv = torch.empty(n, dtype=torch.bfloat16, device=device)
        methods = {"send/recv": _send_recv(rank, peer, send, recv),
                   "batched isend/irecv": _batched(peer, send, recv)}
        if not cpu:
            try:
                methods["peer copy (CE)"] = _peer_copy(peer, send, recv)
            except RuntimeError as exc:  # IPC refused between the two processes: a fact to report
                first_line = str(exc).splitlines()[0]
                rows.append({"mb": mb, "method": "peer copy (CE)", "error": first_line})
        for name, fn in methods.items():
            times = _timed(fn, opts.iters, device)
            med = statistics.median(times)
            rows.append({"mb": mb, "method": name, "median_ms": med * 1e3,
                         "p90_ms": sorted(times)[int(0.9 * (len(times) - 1))] * 1e3,
                         "gb_s": send.numel() * send.element_size() / med / 1e9})
        dist.barrier()
    facts: dict[str, object] = {}
    if not cpu and rank == 0:
        facts["can_access_peer"] = torch.cuda.can_device_access_peer(0, 1)
        facts["device"] = torch.cuda.get_device_name(0)
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if rank == 0:
        Path(out).write_text(json.dumps({"rows": rows, "facts": facts}))
    dist.destroy_process_group()


def _table(rows: list[dict[str, object]]) -> str:
    lines = ["| size MB | method | median ms | p90 ms | GB/s per direction |",
             "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mb']} | {r['method']} | failed: {r['error']} | | |")
        else:
            lines.append(f"| {r['mb']} | {r['method']} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} "
                         f"| {r['gb_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=lambda s: [float(x) for x in s.split(",")],
                    default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU (smoke run)")
    ap.add_argument("--json", type=Path, help="also write the rows and facts here")
    opts = ap.parse_args(argv)
    if not opts.cpu and torch.cuda.device_count() < 2:
        found = torch.cuda.device_count()
        ap.error(f"needs 2 CUDA GPUs (found {found}); --cpu runs the gloo smoke run")
    with tempfile.TemporaryDirectory() as tmp:
        if not opts.cpu:
            os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,P2P",
                              NCCL_DEBUG_FILE=f"{tmp}/nccl.%h.%p")
        out = f"{tmp}/result.json"
        mp.spawn(_worker, args=(2, _free_port(), opts, out), nprocs=2, join=True)
        result = json.loads(Path(out).read_text())
        transports = _transport_lines(Path(tmp))
    print(_table(result["rows"]))
    if not opts.cpu:
        print("\nNCCL transports seen (channel lines):",
              ", ".join(f"{k} x{v}" for k, v in transports.items()) or "none reported")
        print("facts:", json.dumps(result["facts"]))
    if opts.json:
        opts.json.write_text(json.dumps({**result, "transports": dict(transports)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
