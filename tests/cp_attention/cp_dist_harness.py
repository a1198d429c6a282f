"""Multi-process (gloo) harness for the CP attention tests.

Each rank runs every case against one process group (reused across cases, so the expensive
start-up is paid once) and writes its local results to ``<out>/rank<r>.pt``; the test process
reassembles them and compares with a float64 single-process reference.

Ranks are forked from a forkserver that imported torch and ``cp_attention`` once (``_PRELOAD``):
a fresh process per rank, with no torch state from the test process, but torch is not imported
again for every rank of every run (about 2 s of CPU each on the shared two-core machine).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from testkit import free_port

from cp_attention import PackedBatch, cp_attn, partition_for_rank

COMBOS = [
    (comm, strategy, causal)
    for comm in ("p2p", "all_gather")
    for strategy in ("dual_chunk_swap", "no_load_balance")
    for causal in (True, False)
]


@dataclass(frozen=True)
class Case:
    """One packed batch: offsets, head layout and seed of its random inputs."""

    name: str
    cu_seqlens: tuple[int, ...]
    cu_seqlens_padded: tuple[int, ...]
    heads: int = 4
    kv_heads: int = 2
    dim: int = 8
    seed: int = 0


def make_inputs(case: Case) -> dict[str, torch.Tensor]:
    """Deterministic float64 q, k, v, dout over the padded buffer (padding rows random too)."""
    gen = torch.Generator().manual_seed(case.seed)
    total = case.cu_seqlens_padded[-1]

    def rand(heads: int) -> torch.Tensor:
        return torch.randn(total, heads, case.dim, generator=gen, dtype=torch.float64)

    return {"q": rand(case.heads), "k": rand(case.kv_heads), "v": rand(case.kv_heads),
            "dout": rand(case.heads)}


def run_one(case: Case, comm: str, strategy: str, causal: bool, rank: int, cp: int,
            broken: bool = False, save_remote_kv: bool = True) -> dict[str, torch.Tensor]:
    """This rank's out, dq, dk, dv (float32) for one configuration."""
    meta = PackedBatch.from_cu_seqlens(case.cu_seqlens, case.cu_seqlens_padded, cp_size=cp,
                                       strategy=strategy)
    full = make_inputs(case)
    local = {n: partition_for_rank(t, meta, rank).float().contiguous() for n, t in full.items()}
    q, k, v = (local[n].requires_grad_() for n in ("q", "k", "v"))
    out = cp_attn(q, k, v, meta, comm=comm, causal=causal, broken_identity_padding=broken,
                  broken_always_zero_fill=broken, save_remote_kv=save_remote_kv)
    out.backward(local["dout"])
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


_PRELOAD = ["torch", "torch.distributed", "cp_attention"]
"""Modules the forkserver imports once; every rank is forked from it."""


def _worker(
    rank: int, cp: int, port: int, cases: list[Case], combos: list[tuple[str, str, bool]],
    out_dir: str,
) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=cp, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    results: dict[str, object] = {}
    try:
        for case in cases:
            for comm, strategy, causal in combos:
                key = f"{case.name}|{comm}|{strategy}|{causal}"
                fixed = run_one(case, comm, strategy, causal, rank, cp)
                broken = run_one(case, comm, strategy, causal, rank, cp, broken=True)
                ring = run_one(case, comm, strategy, causal, rank, cp, save_remote_kv=False)
                again = run_one(case, comm, strategy, causal, rank, cp)
                results[key] = fixed
                results[key + "|ring_bwd"] = ring
                results[key + "|broken_equal"] = all(torch.equal(fixed[n], broken[n])
                                                     for n in fixed)
                results[key + "|repeat_equal"] = all(torch.equal(fixed[n], again[n])
                                                     for n in fixed)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_distributed(
    cp: int, cases: list[Case], out_dir: Path, combos: list[tuple[str, str, bool]] = COMBOS,
    timeout_s: float = 150,
) -> list[dict]:
    """Start ``cp`` gloo ranks over ``cases`` x ``combos``; returns each rank's results.

    :raises TimeoutError: when the ranks do not finish in time (they are terminated).
    """
    # one thread per rank; set only while the ranks start (the forkserver and its children
    # keep it), never left in this pytest worker's environment for the tests after it
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        mp.get_context("forkserver").set_forkserver_preload(_PRELOAD)  # before its first start
        ctx = mp.start_processes(_worker, args=(cp, free_port(), cases, combos, str(out_dir)),
                                 nprocs=cp, join=False, start_method="forkserver")
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
    while not ctx.join(timeout=5):
        if datetime.datetime.now() > deadline:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.terminate()
            raise TimeoutError(f"{cp} gloo ranks did not finish within {timeout_s} s")
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(cp)]
