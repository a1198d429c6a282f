"""Real models for ``cptrace run`` (spec ``model:``): transformer layers, loss, optimizer step.

``te_transformer`` (``runners/models/te_transformer.py``) stacks ``te.TransformerLayer`` with
``attn_input_format="thd"`` and TE's CP; ``torch_transformer`` (``runners/models/torch_native.py``)
is the same block built from torch layers around the bundled ``cp_attn`` (a baseline without TE
that also runs on CPU). Both return an :class:`runners.arms.Arm` whose ``step()`` is one training
step, so ``runners/workload.py`` times, interleaves and profiles them like attention arms.
"""

from __future__ import annotations

from runners.arms import Arm, RankContext
from runners.models.batch import packed_batch
from runners.packing import PackedLayout
from runners.spec import ModelSpec, Workload


def build_model_arm(
    name: str, model: ModelSpec, workload: Workload, layout: PackedLayout, ctx: RankContext
) -> Arm:
    """One variant's model, optimizer and packed batch on this rank."""
    if model.kind == "te_transformer" and ctx.device.type != "cuda":
        raise RuntimeError("model te_transformer needs CUDA (torch_transformer runs on CPU)")
    batch = packed_batch(model, workload, layout, ctx)
    if model.kind == "te_transformer":
        from runners.models.te_transformer import build_te_transformer

        step = build_te_transformer(model, workload, layout, ctx, batch)
    else:
        from runners.models.torch_native import build_torch_transformer

        step = build_torch_transformer(model, workload, layout, ctx, batch)
    return Arm(name=name, workload=workload, layout=layout, step=step)


def model_hidden(model: ModelSpec, workload: Workload) -> int:
    return model.hidden or workload.heads * workload.head_dim


__all__ = ["build_model_arm", "model_hidden"]
