"""Every rank's CP work on one device (loopback ring), reassembled into full tensors.

Shared by the CPU test of the harness and the GPU test of the cuDNN path: the dK/dV a rank
would send for a remote block are added to the owner's result at the rows the sender's step
read, exactly as ``_saved_kv_backward`` does on the receiving rank.
"""

from __future__ import annotations

import torch

from cp_attention import PackedBatch, partition_for_rank, unpartition
from cp_attention.attention import Tuning, rank_local_work
from cp_attention.merge import add_block_rows
from cp_attention.ring import LoopbackRing


def run_all_ranks(meta: PackedBatch, full: dict, causal: bool, tuning: Tuning,
                  backend: str | None = None) -> dict:
    """Full-batch out, dq, dk, dv from running every rank's local work in turn."""
    cp = meta.cp_size
    local = {n: [partition_for_rank(t, meta, r) for r in range(cp)] for n, t in full.items()}
    results, sent = [], []
    for rank in range(cp):
        kv_blocks = [[local["k"][(rank - i) % cp], local["v"][(rank - i) % cp]]
                     for i in range(1, cp)]
        zeros = [[torch.zeros_like(local["k"][rank]), torch.zeros_like(local["v"][rank])]
                 for _ in range(1, cp)]
        ring = LoopbackRing(rank, cp, kv_blocks, zeros) if cp > 1 else None
        out, _, dq, dk, dv = rank_local_work(local["q"][rank], local["k"][rank],
                                             local["v"][rank], local["dout"][rank], meta, rank,
                                             ring, causal=causal, tuning=tuning,
                                             backend=backend)
        results.append({"out": out, "dq": dq, "dk": dk.clone(), "dv": dv.clone()})
        sent.append(ring.sent if ring is not None else [])
    for rank in range(cp):
        for (dk, dv), owner in sent[rank]:  # dK/dV of remote blocks, back to their owners
            # The owner adds the rows the sender's step read (the rest may be garbage).
            step = (rank - owner) % cp
            call = meta.calls_for("p2p", causal, rank)[step]
            rows = None if call is None else call.k_rows
            add_block_rows(results[owner]["dk"], dk, rows)
            add_block_rows(results[owner]["dv"], dv, rows)
    return {n: unpartition([r[n] for r in results], meta) for n in ("out", "dq", "dk", "dv")}
