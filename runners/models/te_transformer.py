"""``te_transformer``: a stack of ``te.TransformerLayer`` on packed THD batches, TE's CP, AdamW.

Attention + MLP + norms per layer, ``attn_input_format="thd"`` with ``padding_causal`` masks,
CP over the run's group (``set_context_parallel_group``: p2p, all_gather or a2a as TE supports
them for THD), optional FSDP (``FullyShardedDataParallel`` or ``fully_shard``) and optional FP8
(``fp8_autocast`` with the spec's recipe). The ``cu_seqlens`` tensors are built per step and
passed the way the variant's ``metadata`` says, as a training loop hands them to TE. This is
the attention-heavy training schedule of the original reports; with FP8 and a packed token
count that is not a multiple of 8/16 it is TE issue #1795.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from runners.arms import RankContext, te_cu_seqlens_kwargs
from runners.models.batch import PackedBatch
from runners.models.torch_native import _shard
from runners.packing import PackedLayout
from runners.spec import ModelSpec, Workload
from runners.te_import import import_transformer_engine


class _LayerStack(torch.nn.Module):
    """The layers as one module (what FSDP wraps); every layer gets the batch's offsets."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, **kwargs)
        return x


def fp8_recipe(name: str) -> Any:
    """The TE recipe object for a spec ``fp8_recipe`` name."""
    from transformer_engine.common import recipe

    return {
        "delayed": lambda: recipe.DelayedScaling(),
        "current": lambda: recipe.Float8CurrentScaling(),
        "mxfp8": lambda: recipe.MXFP8BlockScaling(),
        "blockwise": lambda: recipe.Float8BlockScaling(),
    }[name]()


def _fp8_autocast(te: Any, recipe: Any, ctx: RankContext) -> Any:
    """``te.autocast`` (TE >= 2.9), else the older ``fp8_autocast`` it replaces."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe, amax_reduction_group=ctx.group)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe, fp8_group=ctx.group)


def build_te_transformer(
    model: ModelSpec, workload: Workload, layout: PackedLayout, ctx: RankContext,
    batch: PackedBatch,
) -> Callable[[], None]:
    import_transformer_engine()
    import transformer_engine.pytorch as te

    hidden = model.hidden or workload.heads * workload.head_dim
    dtype = batch.hidden_states.dtype
    torch.manual_seed(workload.seed)
    layers = [
        te.TransformerLayer(
            hidden,
            model.ffn_hidden or 4 * hidden,
            workload.heads,
            num_gqa_groups=workload.kv_heads or workload.heads,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            self_attn_mask_type="padding_causal" if workload.causal else "padding",
            attn_input_format="thd",
            params_dtype=dtype,
            layer_number=i + 1,
            device=ctx.device,
        )
        for i in range(workload.layers)
    ]
    if ctx.world > 1:
        stream = torch.cuda.Stream(device=ctx.device)
        ranks = dist.get_process_group_ranks(ctx.group)
        lb: dict[str, Any] = {}
        if workload.strategy != "dual_chunk_swap":
            from transformer_engine.pytorch.constants import CPLoadBalancingStrategy

            lb["load_balancing_strategy"] = CPLoadBalancingStrategy(workload.strategy)
        for layer in layers:
            layer.set_context_parallel_group(ctx.group, ranks, stream, workload.cp_comm, **lb)
    stack = _LayerStack(layers)
    net = _shard(stack, layers, model.fsdp, ctx)
    optimizer = torch.optim.AdamW(net.parameters(), lr=model.lr)
    recipe = fp8_recipe(model.fp8_recipe) if model.fp8 else None
    extra: dict[str, Any] = {"max_seqlen_q": batch.max_seqlen, "max_seqlen_kv": batch.max_seqlen}
    if workload.pad_between_seqs is not None:
        extra["pad_between_seqs"] = workload.pad_between_seqs

    def step() -> None:
        x = batch.hidden_states.detach().requires_grad_(True)
        autocast = _fp8_autocast(te, recipe, ctx) if recipe is not None else (
            contextlib.nullcontext()
        )
        with autocast:
            out = net(x, **te_cu_seqlens_kwargs(workload, layout, ctx.device), **extra)
        out.float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
