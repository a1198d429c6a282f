"""The fake repository's own training script: ``torchrun --nproc-per-node 2 train.py --steps N``.

A tiny model on CPU/gloo: a linear QKV projection, the bundled context-parallel attention
(``cp_attn``, whose catalogued ranges the PyTorch profiler records), a loss, an all-reduce of
the gradients and ``torch.optim`` steps (the steps ``cptrace profile --torch`` counts). The loop's
slow commit sets ``BROKEN = True``: the attention's broken switches (per-step metadata recompute,
unconditional gradient zero-fill) add work and make catalogued helpers run that the fixed code
never calls.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from cp_attention import PackedBatch, cp_attn, partition_for_rank

BROKEN = False
HEADS, DIM = 2, 8
CU_SEQLENS = [0, 16, 24, 32]  # three packed sequences, no padding, divisible by 2 * cp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    cu = torch.tensor(CU_SEQLENS, dtype=torch.int32)
    # Passed as a distinct but equal tensor, as a data loader would.
    meta = PackedBatch.from_cu_seqlens(cu, cu.clone(), cp_size=world, device="cpu")
    proj = torch.nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
    optimizer = torch.optim.SGD(proj.parameters(), lr=0.01)
    tokens = partition_for_rank(torch.randn(CU_SEQLENS[-1], HEADS * DIM), meta, rank)
    for _ in range(args.steps):
        q, k, v = proj(tokens).view(-1, 3, HEADS, DIM).unbind(1)
        out = cp_attn(
            q.contiguous(), k.contiguous(), v.contiguous(), meta,
            broken_identity_padding=BROKEN, broken_always_zero_fill=BROKEN,
        )  # fmt: skip
        loss = out.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in proj.parameters():  # data-parallel gradients, as DDP would
            assert param.grad is not None
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
