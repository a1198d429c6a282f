"""Turn a spec plus the ranks' result records into the bundle manifest's run facts.

The manifest carries what traces cannot show (``analyzers/manifest.py``): the workload, each
variant's packed-metadata facts (values of ``cu_seqlens`` and ``cu_seqlens_padded``, whether the
padded tensor *was* the unpadded object, ``pad_between_seqs``, token counts and alignment) and
the per-rank iteration times. The facts come from the spec and the host-side layout, the same
values the workload handed to attention, not from reading tensors back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runners.packing import PackedLayout
from runners.spec import ModelSpec, RunSpec, Workload, layout_for

# Manifest spelling of implementations (analyzers.manifest.Workload.implementation).
MANIFEST_IMPLEMENTATION = {"bundled": "bundled", "te": "te", "te_adapter": "te-adapter"}
_MANIFEST_WORKLOAD_KEYS = (
    "cp_comm",
    "strategy",
    "causal",
    "heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "layers",
)


@dataclass(slots=True)
class ManifestParts:
    """Keyword arguments for ``runners.bundle.finalize_bundle`` (``fields``) plus extras."""

    fields: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


def manifest_workload(
    workload: Workload, *, ranks: int, model: ModelSpec | None = None
) -> dict[str, Any]:
    """A workload in the manifest's vocabulary (``analyzers.manifest.Workload``)."""
    implementation = MANIFEST_IMPLEMENTATION[workload.implementation]
    if model is not None:  # the model decides the attention: TE's or the bundled cp_attn
        implementation = "te" if model.kind == "te_transformer" else "bundled"
    out: dict[str, Any] = {
        "implementation": implementation,
        "cp_size": ranks,
        "seqlens": workload.resolved_seqlens(),
    }
    out.update({k: getattr(workload, k) for k in _MANIFEST_WORKLOAD_KEYS})
    # Extra (allowed) keys: the bundled implementation's switches and how metadata was passed.
    out.update(
        metadata=workload.metadata,
        token_alignment=workload.token_alignment,
        broken_identity_padding=workload.broken_identity_padding,
        broken_always_zero_fill=workload.broken_always_zero_fill,
    )
    if model is not None:
        out["model"] = model.model_dump(mode="json")
    return out


def variant_facts(
    workload: Workload, layout: PackedLayout, model: ModelSpec | None = None
) -> dict[str, Any]:
    """``MetadataFacts`` of one variant: the metadata exactly as passed to attention."""
    zero_fill = None
    if workload.implementation == "bundled" and (model is None or model.kind != "te_transformer"):
        # The bundled implementation zero-fills only real padding unless told to be broken.
        zero_fill = workload.broken_always_zero_fill or not layout.padded_equals_unpadded
    same_object = workload.metadata == "same_object"
    pad_between_seqs = workload.pad_between_seqs
    if workload.implementation == "te_adapter":
        # What the adapter hands TE: one object and False without padding, else True.
        same_object = layout.padded_equals_unpadded
        pad_between_seqs = not layout.padded_equals_unpadded
    return {
        "cu_seqlens": list(layout.cu_seqlens),
        "cu_seqlens_padded": list(layout.cu_seqlens_padded),
        "padded_is_same_object": same_object,
        "pad_between_seqs": pad_between_seqs,
        "total_tokens": layout.total_tokens,
        "token_alignment": workload.token_alignment,
        "zero_fill_grad_tails": zero_fill,
        # Model runs only: attention-only arms have neither (the manifest's default is False).
        **({"fp8": model.fp8, "fsdp": model.fsdp != "none"} if model is not None else {}),
    }


def facts_summary(workload: Workload, layout: PackedLayout) -> dict[str, Any]:
    """The human-readable facts (``variant_facts`` extra key): equality, identity, alignment."""
    alignment = workload.token_alignment
    return {
        "padded_equals_unpadded": layout.padded_equals_unpadded,
        "same_object": variant_facts(workload, layout)["padded_is_same_object"],
        "metadata": workload.metadata,
        "total_tokens": layout.total_tokens,
        "real_tokens": layout.cu_seqlens[-1],
        "token_alignment": alignment,
        "total_tokens_aligned": None if alignment is None else layout.total_tokens % alignment == 0,
    }


def variant_entry(
    spec: RunSpec,
    name: str,
    *,
    window: str | None = None,
    iteration_ms: dict[int, list[float]] | None = None,
) -> dict[str, Any]:
    """One ``variants`` item: window, facts, the workload fields it changes, timings per rank."""
    workload = spec.variant_workload(name)
    layout = layout_for(workload, spec.ranks)
    base = manifest_workload(spec, ranks=spec.ranks, model=spec.model)
    mine = manifest_workload(workload, ranks=spec.ranks, model=spec.model)
    return {
        "name": name,
        "window": window or f"arm:{name}",
        "facts": variant_facts(workload, layout, spec.model),
        "workload": {k: v for k, v in mine.items() if base.get(k) != v},
        "iteration_ms": dict(sorted((iteration_ms or {}).items())),
    }


def build_manifest_parts(spec: RunSpec, results: list[dict[str, Any]]) -> ManifestParts:
    """Workload, variants (facts + iteration_ms per rank) and environment of a finished run."""
    variants = []
    summaries = {}
    for name in spec.variant_names():
        timings = {int(r["rank"]): r["iteration_ms"][name] for r in results if "iteration_ms" in r}
        variants.append(variant_entry(spec, name, iteration_ms=timings))
        workload = spec.variant_workload(name)
        summaries[name] = facts_summary(workload, layout_for(workload, spec.ranks))
    environment: dict[str, Any] = next(
        (r["environment"] for r in results if "environment" in r), {}
    )
    return ManifestParts(
        fields={
            "workload": manifest_workload(spec, ranks=spec.ranks, model=spec.model),
            "variants": variants,
            "environment": environment,
        },
        extra={"variant_facts": summaries},
    )
