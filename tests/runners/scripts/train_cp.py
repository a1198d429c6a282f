"""A small training job on the bundled cp_attn, run by the profile tests (gloo, CPU).

It knows nothing of cptrace: ``cptrace profile -- python train_cp.py`` or ``-- torchrun
--nproc-per-node 2 train_cp.py`` must profile it unedited. Each step: a linear projection, CP
attention over the packed batch (value-equal padded offsets, passed as a clone), a loss, an
optimizer step. ``--seqlens`` sets the real lengths (padded to multiples of 2*cp when they are
not). ``--broken-identity`` makes cp_attn reproduce TE's identity-based padding path.
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
import torch.distributed as dist

from cp_attention import PackedBatch, cp_attn, partition_for_rank


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--broken-identity", action="store_true")
    parser.add_argument("--seqlens", default="16,8,8", help="real lengths, comma separated")
    args, _ = parser.parse_known_args()  # e.g. --token: a secret cptrace must not record
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(0)
    lengths = [int(n) for n in args.seqlens.split(",")]
    multiple = 2 * world  # DualChunkSwap: each padded length a multiple of 2*cp
    padded = [-(-n // multiple) * multiple for n in lengths]
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    cu_padded = torch.tensor([0, *itertools.accumulate(padded)], dtype=torch.int32)
    # Value-equal clone when nothing needs padding, real padding otherwise.
    meta = PackedBatch.from_cu_seqlens(cu, cu_padded, cp_size=world)
    heads, dim = 2, 8
    proj = torch.nn.Linear(heads * dim, heads * dim)
    opt = torch.optim.SGD(proj.parameters(), lr=0.01)
    x_full = torch.randn(meta.total_tokens, heads, dim)
    x = partition_for_rank(x_full, meta, rank)
    for _ in range(args.steps):
        h = proj(x.reshape(x.shape[0], -1)).reshape(x.shape)
        out = cp_attn(h, h, h, meta, comm="p2p", broken_identity_padding=args.broken_identity,
                      broken_always_zero_fill=args.broken_identity)
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
