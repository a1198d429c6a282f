"""A small single-GPU transformer using torch SDPA (flash and cuDNN backends), no TE, no
torch.distributed: the most common first trace a user brings (one process, one Kineto file,
no distributedInfo). Usage: sdpa_model.py OUT_DIR [--nsys] (with --nsys: no profiler, the
process runs under nsys)."""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int, backend: SDPBackend) -> None:
        super().__init__()
        self.heads, self.backend = heads, backend
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        with sdpa_kernel(self.backend):
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def main() -> None:
    out, under_nsys = sys.argv[1], "--nsys" in sys.argv
    torch.manual_seed(0)
    dev = "cuda"
    blocks = [
        Block(1024, 16, SDPBackend.FLASH_ATTENTION if i % 2 == 0 else SDPBackend.CUDNN_ATTENTION)
        for i in range(4)
    ]
    model = torch.nn.Sequential(*blocks).to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4, 2048, 1024, device=dev, dtype=torch.bfloat16)

    def step() -> None:
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if under_nsys:
        for _ in range(6):
            step()
        torch.cuda.synchronize()
        return
    sched = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(
        activities=acts, schedule=sched, with_stack=True, record_shapes=True
    ) as prof:
        for _ in range(6):
            step()
            prof.step()
    torch.cuda.synchronize()
    prof.export_chrome_trace(f"{out}/kineto_sdpa_single_gpu.json")


if __name__ == "__main__":
    main()
