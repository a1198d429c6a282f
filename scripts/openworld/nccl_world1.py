"""NCCL collectives with no context parallelism (world size 1 on one GPU): an all-to-all
(recsys embedding exchange), an all-reduce (data parallel), an all-gather and a send/recv to
itself (pipeline-style P2P). cptrace must not call any of these CP."""

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    out = sys.argv[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    a = torch.randn(1 << 20, device="cuda")
    w = torch.randn(2048, 2048, device="cuda")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(
        activities=acts,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
        with_stack=True,
    ) as prof:
        for _ in range(4):
            y = torch.empty_like(a)
            dist.all_to_all_single(y, a)
            z = w @ w
            dist.all_reduce(z)
            g = torch.empty_like(a)
            dist.all_gather_into_tensor(g, a)
            r = torch.empty_like(a)
            ops = [dist.P2POp(dist.isend, a, 0), dist.P2POp(dist.irecv, r, 0)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            torch.cuda.synchronize()
            prof.step()
    prof.export_chrome_trace(f"{out}/kineto_nccl_world1.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
