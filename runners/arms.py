"""Build one *arm* per variant: its inputs on this rank and a ``step()`` running fwd+bwd.

Kept apart from the run loop (``runners/workload.py``), as torchtitan keeps the model apart from
its parallelization: this module knows the three implementations (bundled ``cp_attention``,
stock TE, TE through the adapter), the loop knows timing, interleaving and profilers.

One step = ``layers`` attention calls chained (each layer's output is the next layer's query)
and one backward through all of them, on the rank's partition of one packed batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runners.packing import PackedLayout
from runners.spec import Workload
from runners.te_import import import_transformer_engine

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True, slots=True, kw_only=True)
class RankContext:
    """Where this process sits in the run."""

    rank: int
    world: int
    group: dist.ProcessGroup
    device: torch.device


@dataclass(slots=True, kw_only=True)
class Arm:
    """One variant, ready to run: ``step()`` does one forward+backward of every layer."""

    name: str
    workload: Workload
    layout: PackedLayout
    step: Callable[[], None]


@dataclass(frozen=True, slots=True)
class FullInputs:
    """The whole packed batch (every rank builds the same one from the seed, then slices it)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor


def full_inputs(workload: Workload, layout: PackedLayout, device: torch.device) -> FullInputs:
    """Seeded random THD tensors ``[tokens, heads, head_dim]`` (padding rows included)."""
    gen = torch.Generator().manual_seed(workload.seed)
    dtype = _DTYPES[workload.dtype]
    kv_heads = workload.kv_heads or workload.heads

    def rand(heads: int) -> torch.Tensor:
        shape = (layout.total_tokens, heads, workload.head_dim)
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(device, dtype)

    return FullInputs(
        q=rand(workload.heads), k=rand(kv_heads), v=rand(kv_heads), dout=rand(workload.heads)
    )


def _metadata_tensors(
    workload: Workload, layout: PackedLayout, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cu_seqlens, cu_seqlens_padded)`` passed the way the variant says.

    ``same_object`` passes one tensor twice (TE's identity check sees "no padding");
    ``value_equal_clone`` passes an equal copy (the identity check says "padding").
    """
    cu = torch.tensor(layout.cu_seqlens, dtype=torch.int32, device=device)
    if workload.metadata == "same_object":
        return cu, cu
    if workload.metadata == "value_equal_clone":
        return cu, cu.clone()
    return cu, torch.tensor(layout.cu_seqlens_padded, dtype=torch.int32, device=device)


def te_cu_seqlens_kwargs(
    workload: Workload, layout: PackedLayout, device: torch.device
) -> dict[str, torch.Tensor]:
    """Stock TE's four ``cu_seqlens`` arguments for one batch, freshly built on ``device``.

    Built from the host values on every call (as a training loop does per batch), passed the
    way the variant says (see :func:`_metadata_tensors`).
    """
    cu, cu_padded = _metadata_tensors(workload, layout, device)
    return {
        "cu_seqlens_q": cu,
        "cu_seqlens_kv": cu,
        "cu_seqlens_q_padded": cu_padded,
        "cu_seqlens_kv_padded": cu_padded,
    }


def _leaf(x: torch.Tensor, *, grad: bool) -> torch.Tensor:
    return x.detach().contiguous().requires_grad_(grad)


def _chain_backward(
    layers: list[Callable[[torch.Tensor], torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
) -> Callable[[], None]:
    def step() -> None:
        for t in (q, k, v):
            t.grad = None
        x = q
        for layer in layers:
            x = layer(x).view(q.shape)
        x.backward(dout)

    return step


def build_bundled(
    name: str, workload: Workload, layout: PackedLayout, ctx: RankContext, inputs: FullInputs
) -> Arm:
    """The bundled ``cp_attention`` implementation; metadata is built per step, from values."""
    from cp_attention import PackedBatch, cp_attn, partition_for_rank

    cu, cu_padded = _metadata_tensors(workload, layout, torch.device("cpu"))

    def metadata() -> Any:
        return PackedBatch.from_cu_seqlens(
            cu,
            cu_seqlens_padded=cu_padded,
            cp_size=ctx.world,
            strategy=workload.strategy,
            device=ctx.device,
        )

    meta0 = metadata()
    q, k, v, dout = (
        _leaf(partition_for_rank(t, meta0, ctx.rank), grad=g)
        for t, g in ((inputs.q, True), (inputs.k, True), (inputs.v, True), (inputs.dout, False))
    )
    holder = {"meta": meta0}

    def run_layer(x: torch.Tensor) -> torch.Tensor:
        return cp_attn(
            x,
            k,
            v,
            holder["meta"],
            group=ctx.group,
            comm=workload.cp_comm,
            causal=workload.causal,
            broken_identity_padding=workload.broken_identity_padding,
            broken_always_zero_fill=workload.broken_always_zero_fill,
        )

    chained = _chain_backward([run_layer] * workload.layers, q, k, v, dout)

    def step() -> None:
        holder["meta"] = metadata()  # once per batch, as a training loop would
        chained()

    return Arm(name=name, workload=workload, layout=layout, step=step)


def _te_partition_index(
    workload: Workload, cu_padded: torch.Tensor, total: int, ctx: RankContext
) -> torch.Tensor:
    """TE's own THD partition indices, so inputs match what TE's CP expects."""
    import_transformer_engine()
    from transformer_engine.pytorch.attention.dot_product_attention import context_parallel

    fn = getattr(context_parallel, "get_thd_partitioned_indices", None)
    if fn is not None:  # TE >= 2.20: knows both strategies
        from transformer_engine.pytorch.constants import CPLoadBalancingStrategy

        strategy = CPLoadBalancingStrategy(workload.strategy)
        return fn(cu_padded, total, ctx.world, ctx.rank, load_balancing_strategy=strategy)
    if workload.strategy != "dual_chunk_swap":
        raise RuntimeError("this Transformer Engine has no NoLoadBalance THD partition")
    import transformer_engine_torch as tex

    return tex.thd_get_partitioned_indices(cu_padded, total, ctx.world, ctx.rank)


def build_te(
    name: str,
    workload: Workload,
    layout: PackedLayout,
    ctx: RankContext,
    inputs: FullInputs,
    *,
    adapter: bool = False,
) -> Arm:
    """Stock TE ``DotProductAttention`` (or the adapter) with P2P/all-gather CP over THD."""
    import_transformer_engine()
    if adapter:
        from cp_attention.te_adapter import AdaptedDotProductAttention

        attention_cls: Any = AdaptedDotProductAttention
    else:
        from transformer_engine.pytorch import DotProductAttention

        attention_cls = DotProductAttention

    # Setup only (partitioning the inputs); each step builds its own offsets, see refresh().
    _, cu_padded = _metadata_tensors(workload, layout, ctx.device)
    index = _te_partition_index(workload, cu_padded, layout.total_tokens, ctx)
    q, k, v, dout = (
        _leaf(t.index_select(0, index), grad=g)
        for t, g in ((inputs.q, True), (inputs.k, True), (inputs.v, True), (inputs.dout, False))
    )
    cp_stream = torch.cuda.Stream(device=ctx.device)
    ranks = dist.get_process_group_ranks(ctx.group)
    lb: dict[str, Any] = {}
    if workload.strategy != "dual_chunk_swap":
        from transformer_engine.pytorch.constants import CPLoadBalancingStrategy

        lb["load_balancing_strategy"] = CPLoadBalancingStrategy(workload.strategy)
    modules = []
    for _ in range(workload.layers):
        attn = attention_cls(
            workload.heads,
            workload.head_dim,
            num_gqa_groups=workload.kv_heads or workload.heads,
            qkv_format="thd",
            attn_mask_type="padding_causal" if workload.causal else "padding",
            attention_dropout=0.0,
        )
        attn.set_context_parallel_group(ctx.group, ranks, cp_stream, workload.cp_comm, **lb)
        modules.append(attn)
    max_seqlen = max(b - a for a, b in itertools.pairwise(layout.cu_seqlens_padded))
    # The cu_seqlens tensors are added per step by refresh() (stock TE) or by the adapter.
    kwargs: dict[str, Any] = dict(max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)
    if workload.pad_between_seqs is not None:
        kwargs["pad_between_seqs"] = workload.pad_between_seqs
    holder: dict[str, Any] = {}
    if adapter:
        # The adapter decides padding from a host-side PackedBatch (built once per step, as a
        # training loop would per batch) and fills every cu_seqlens argument itself.
        from cp_attention import PackedBatch

        cu_host, cu_padded_host = _metadata_tensors(workload, layout, torch.device("cpu"))
        kwargs = {}

        def refresh() -> None:
            holder["packed_batch"] = PackedBatch.from_cu_seqlens(
                cu_host,
                cu_seqlens_padded=cu_padded_host,
                cp_size=ctx.world,
                strategy=workload.strategy,
                device=ctx.device,
            )
    else:

        def refresh() -> None:
            # Like-for-like with the bundled and adapter arms, which build their metadata every
            # step: a training loop moves each batch's cu_seqlens to the GPU, so the stock arm
            # pays that host-to-device work per step too instead of reusing tensors built once.
            kwargs.update(te_cu_seqlens_kwargs(workload, layout, ctx.device))

    def layer_fn(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda x: module(x, k, v, **kwargs, **holder)

    chained = _chain_backward([layer_fn(m) for m in modules], q, k, v, dout)

    def step() -> None:
        refresh()
        chained()

    return Arm(name=name, workload=workload, layout=layout, step=step)


def build_arm(
    name: str, workload: Workload, layout: PackedLayout, ctx: RankContext, inputs: FullInputs
) -> Arm:
    """Dispatch on the variant's implementation."""
    if workload.implementation == "bundled":
        return build_bundled(name, workload, layout, ctx, inputs)
    if ctx.device.type != "cuda":
        raise RuntimeError(f"implementation {workload.implementation!r} needs CUDA GPUs")
    return build_te(
        name, workload, layout, ctx, inputs, adapter=workload.implementation == "te_adapter"
    )
