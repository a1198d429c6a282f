"""``torch_transformer``: pre-norm transformer layers from torch modules around the bundled cp_attn.

The baseline without TE: LayerNorm -> QKV projection -> ``cp_attn`` (THD, CP over the run's
group) -> output projection -> residual, LayerNorm -> GELU MLP -> residual; AdamW. Runs on CPU
with gloo (tests, laptops) and on CUDA. Optional FSDP over the same ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from runners.arms import RankContext
from runners.models.batch import PackedBatch
from runners.packing import PackedLayout
from runners.spec import ModelSpec, Workload


class TorchTransformerLayer(nn.Module):
    """One pre-norm block; attention is ``cp_attn`` over the packed batch's metadata."""

    def __init__(self, hidden: int, ffn: int, workload: Workload, ctx: RankContext) -> None:
        super().__init__()
        self.heads = workload.heads
        self.kv_heads = workload.kv_heads or workload.heads
        self.head_dim = workload.head_dim
        self.workload = workload
        self.ctx = ctx
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, (self.heads + 2 * self.kv_heads) * self.head_dim)
        self.proj = nn.Linear(self.heads * self.head_dim, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
        self.meta: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from cp_attention import cp_attn

        t = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim,
             self.kv_heads * self.head_dim], dim=-1,
        )
        out = cp_attn(
            q.reshape(t, self.heads, self.head_dim).contiguous(),
            k.reshape(t, self.kv_heads, self.head_dim).contiguous(),
            v.reshape(t, self.kv_heads, self.head_dim).contiguous(),
            self.meta,
            group=self.ctx.group,
            comm=self.workload.cp_comm,
            causal=self.workload.causal,
        )
        x = x + self.proj(out.reshape(t, -1))
        return x + self.mlp(self.norm2(x))


def _shard(
    model: nn.Module, layers: Sequence[nn.Module], mode: str, ctx: RankContext
) -> nn.Module:
    if mode == "fully_shard":
        from torch.distributed.fsdp import fully_shard

        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    if mode == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        device_id = ctx.device if ctx.device.type == "cuda" else None
        return FullyShardedDataParallel(model, device_id=device_id, use_orig_params=True)
    return model


def build_torch_transformer(
    model: ModelSpec, workload: Workload, layout: PackedLayout, ctx: RankContext,
    batch: PackedBatch,
) -> Callable[[], None]:
    from cp_attention import PackedBatch as Meta

    hidden = model.hidden or workload.heads * workload.head_dim
    torch.manual_seed(workload.seed)  # the same weights on every rank
    layers = [
        TorchTransformerLayer(hidden, model.ffn_hidden or 4 * hidden, workload, ctx)
        for _ in range(workload.layers)
    ]
    stack = nn.Sequential(*layers).to(ctx.device, batch.hidden_states.dtype)
    net = _shard(stack, layers, model.fsdp, ctx)
    optimizer = torch.optim.AdamW(net.parameters(), lr=model.lr)
    cu_host = batch.cu_seqlens.cpu()
    cu_padded_host = batch.cu_seqlens_padded.cpu()

    def step() -> None:
        # Metadata from values, once per batch, as a training loop on cp_attn does.
        meta = Meta.from_cu_seqlens(cu_host, cu_padded_host, cp_size=ctx.world,
                                    strategy=workload.strategy, device=ctx.device)
        for layer in layers:
            layer.meta = meta
        out = net(batch.hidden_states)
        out.float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
