"""Every rank's CP work on one device (loopback ring or all-gather), reassembled.

Shared by the CPU test of the harness and the GPU test of the cuDNN path: P2P: the dK/dV a
rank would send for a remote block are added to the owner's result at the rows the sender's
step read, exactly as ``_saved_kv_backward`` does on the receiving rank; all-gather: the
gathered dK/dV blocks a rank contributes to the other owners are added to theirs, as the
reduce-scatter does.
"""

from __future__ import annotations

import torch

from cp_attention import PackedBatch, partition_for_rank, unpartition
from cp_attention.attention import Tuning, rank_local_work
from cp_attention.graphs import StepGraphs
from cp_attention.merge import add_block_rows
from cp_attention.ring import LoopbackGather, LoopbackRing


def run_all_ranks(meta: PackedBatch, full: dict, causal: bool, tuning: Tuning,
                  backend: str | None = None, graphs: StepGraphs | None = None,
                  local: dict | None = None, comm: str = "p2p") -> dict:
    """Full-batch out, dq, dk, dv from running every rank's local work in turn.

    ``graphs``: through CUDA graphs bound to the tensors of ``local`` (each rank's parts of
    ``full``; pass the same ``local`` again to replay them).
    """
    cp = meta.cp_size
    if local is None:
        local = local_parts(meta, full)
    results, sent = [], []
    for rank in range(cp):
        kv_blocks = [[local["k"][(rank - i) % cp], local["v"][(rank - i) % cp]]
                     for i in range(1, cp)]
        zeros = local["zeros"][rank]
        ring: LoopbackRing | LoopbackGather | None = None
        if cp > 1 and comm == "all_gather":
            ring = LoopbackGather(rank, cp, local["gathered"], zeros)
        elif cp > 1:
            ring = LoopbackRing(rank, cp, kv_blocks, zeros)
        out, _, dq, dk, dv = rank_local_work(local["q"][rank], local["k"][rank],
                                             local["v"][rank], local["dout"][rank], meta, rank,
                                             ring, causal=causal, tuning=tuning,
                                             backend=backend, graphs=graphs, comm=comm)
        # Cloned: a graph's outputs are overwritten by its next replay.
        results.append({"out": out.clone(), "dq": dq.clone(), "dk": dk.clone(),
                        "dv": dv.clone()})
        sent.append(ring.sent if ring is not None else [])
    for rank in range(cp):
        for (dk, dv), owner in sent[rank] if comm == "all_gather" else ():
            results[owner]["dk"] += dk  # a gathered block's dK/dV: every row is written
            results[owner]["dv"] += dv
        for (dk, dv), owner in sent[rank] if comm == "p2p" else ():
            # dK/dV of remote blocks, back to their owners
            # The owner adds the rows the sender's step read (the rest may be garbage).
            step = (rank - owner) % cp
            call = meta.calls_for("p2p", causal, rank)[step]
            rows = None if call is None else call.k_rows
            add_block_rows(results[owner]["dk"], dk, rows)
            add_block_rows(results[owner]["dv"], dv, rows)
    return {n: unpartition([r[n] for r in results], meta) for n in ("out", "dq", "dk", "dv")}


def local_parts(meta: PackedBatch, full: dict) -> dict:
    """Each rank's parts of ``full`` and the zero dK/dV its peers hand in (loopback)."""
    cp = meta.cp_size
    local = {n: [partition_for_rank(t, meta, r).contiguous() for r in range(cp)]
             for n, t in full.items()}
    local["gathered"] = [torch.cat(local["k"]), torch.cat(local["v"])]
    local["zeros"] = [[[torch.zeros_like(local["k"][r]), torch.zeros_like(local["v"][r])]
                       for _ in range(1, cp)] for r in range(cp)]
    return local
