"""CP attention correctness on 2 GPUs (NCCL), bf16, against the single-GPU kernel.

For every comm x strategy x causal combination, several packed batches (no padding, tail
padding, a single sequence, GQA) and every local kernel available (torch flash, cuDNN frontend):

* CP output and dQ/dK/dV vs the same kernel on one GPU over the whole batch (bf16), and vs the
  exact float64 math kernel (catches kernel-level layout mistakes);
* the broken (TE-style) switches give bit-identical results;
* ``torch.cuda.set_sync_debug_mode("error")`` around a warm forward+backward proves the step
  performs no device-to-host sync.

Run: ``NCCL_NVLS_ENABLE=0 PYTHONPATH=. python benchmarks/gpu_correctness.py``
(``--cpu`` runs the same checks on gloo with the math kernel, as a smoke test). Exit status 1
when any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cp_attention import PackedBatch, cp_attn, pad_sequences_to_multiple, partition_for_rank
from cp_attention.local_attention import cudnn_available

COMBOS = [(c, s, causal) for c in ("p2p", "all_gather")
          for s in ("dual_chunk_swap", "no_load_balance") for causal in (True, False)]
#: bf16 has an 8-bit mantissa (eps 7.8e-3); CP changes the accumulation order and adds one
#: rounding of the merged output, so errors of a few eps relative to the largest value are
#: expected, while masking or merge bugs give O(1) errors.
TOL = 3e-2


def cases(scale: int) -> list[tuple[str, list[int], int, int]]:
    """(name, real lengths, heads, kv_heads); lengths divided by ``scale`` for CPU smoke runs."""
    return [
        ("ref_like", [1024 // scale, 512 // scale, 256 // scale, 256 // scale], 16, 16),
        ("tail_padded", [1000 // scale, 333 // scale, 130 // scale], 16, 16),
        ("single_seq", [777 // scale], 8, 8),
        ("gqa", [512 // scale, 256 // scale, 128 // scale], 16, 4),
    ]


def _offsets(lengths: list[int], cp: int) -> tuple[list[int], list[int]]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu, pad_sequences_to_multiple(cu, 2 * cp)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def _run(q, k, v, dout, meta, backend, comm, causal, group, broken=False, save_remote_kv=True):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = cp_attn(q, k, v, meta, group=group, comm=comm, causal=causal, backend=backend,
                  broken_identity_padding=broken, broken_always_zero_fill=broken,
                  save_remote_kv=save_remote_kv)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def check_case(rank, cp, device, name, lengths, heads, kv_heads, backend, rows):
    cu, cup = _offsets(lengths, cp)
    gen = torch.Generator().manual_seed(len(lengths) * 1000 + heads)
    total, dim = cup[-1], 128 if device.type == "cuda" else 16
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    full = {n: torch.randn(total, h, dim, generator=gen).to(device, dtype)
            for n, h in (("q", heads), ("k", kv_heads), ("v", kv_heads), ("dout", heads))}
    single = PackedBatch.from_cu_seqlens(cu, cup, cp_size=1, device=device)
    refs = {}
    for causal in (True, False):
        refs[causal] = (
            _run(*(full[n] for n in ("q", "k", "v", "dout")), single, backend, "p2p", causal, None),
            _run(*(full[n].double() for n in ("q", "k", "v", "dout")), single, "math", "p2p",
                 causal, None),
        )
    for comm, strategy, causal in COMBOS:
        meta = PackedBatch.from_cu_seqlens(cu, cup, cp_size=cp, strategy=strategy, device=device)
        local = {n: partition_for_rank(t, meta, rank).contiguous() for n, t in full.items()}
        args = (*(local[n] for n in ("q", "k", "v", "dout")), meta, backend, comm, causal, None)
        got = _run(*args)
        want, exact = refs[causal]
        errs = {n: _rel(got[n], partition_for_rank(want[n], meta, rank)) for n in got}
        errs_exact = {n: _rel(got[n], partition_for_rank(exact[n], meta, rank)) for n in got}
        broken = _run(*args[:-1], None, broken=True)
        ring = _run(*args[:-1], None, save_remote_kv=False)
        # Forward is deterministic: bit-equal. The flash/cuDNN backward accumulates dQ with
        # atomics (run-to-run noise), so gradients are compared at bf16 rounding level.
        same = torch.equal(got["out"], broken["out"]) and all(
            _rel(broken[n], got[n]) < 1e-2 and _rel(ring[n], got[n]) < 1e-2 for n in got)
        sync_ok = _no_sync(args, device)
        ok = max(errs.values()) < TOL and max(errs_exact.values()) < TOL and same and sync_ok
        rows.append((backend, name, comm, strategy, causal, max(errs.values()),
                     max(errs_exact.values()), same, sync_ok, ok))


def _no_sync(args, device) -> bool:
    """Whether a warm forward+backward runs with sync debug mode set to error."""
    if device.type != "cuda":
        return True
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        _run(*args)
    except RuntimeError as exc:
        print(f"sync detected: {exc}", file=sys.stderr)
        return False
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return True


def worker(rank: int, cp: int, port: int, use_cpu: bool) -> None:
    device = torch.device("cpu") if use_cpu else torch.device("cuda", rank)
    if not use_cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if use_cpu else "nccl", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=cp, timeout=datetime.timedelta(seconds=120),
                            device_id=None if use_cpu else device)
    backends = ["math"] if use_cpu else ["flash"] + (["cudnn"] if cudnn_available() else [])
    rows: list[tuple] = []
    try:
        for backend in backends:
            for name, lengths, heads, kv_heads in cases(16 if use_cpu else 1):
                try:
                    check_case(rank, cp, device, name, lengths, heads, kv_heads, backend, rows)
                except Exception as exc:
                    rows.append((backend, name, "-", "-", "-", float("nan"), float("nan"),
                                 False, False, False))
                    print(f"rank {rank} {backend} {name}: {type(exc).__name__}: {exc}",
                          file=sys.stderr)
        gathered: list = [None] * cp
        dist.all_gather_object(gathered, rows)
        if rank == 0:
            _print(gathered)
            failed = sum(1 for r in gathered for row in r if not row[-1])
            print(f"RESULT: {'FAIL' if failed else 'PASS'} ({failed} failing rows)")
    finally:
        dist.destroy_process_group()


def _print(gathered: list) -> None:
    print("| kernel | case | comm | strategy | causal | max rel err vs 1-GPU | vs fp64 | "
          "broken/ring-bwd agree | no host sync | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, row in enumerate(gathered[0]):
        worst = [max(r[i][5] for r in gathered), max(r[i][6] for r in gathered)]
        flags = [all(r[i][j] for r in gathered) for j in (7, 8, 9)]
        print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} | {row[4]} | {worst[0]:.2e} | "
              f"{worst[1]:.2e} | {flags[0]} | {flags[1]} | {flags[2]} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="gloo + math kernel smoke test")
    parser.add_argument("--cp", type=int, default=2)
    args = parser.parse_args()
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(args.cp, port, args.cpu), nprocs=args.cp, start_method="spawn")


if __name__ == "__main__":
    main()
