"""Manifest facts from a spec: what each variant handed to attention, and per-rank timings."""

from __future__ import annotations

from pathlib import Path

from analyzers.manifest import parse_manifest
from runners.manifest import build_manifest_parts
from runners.spec import load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "runners" / "examples"
CU = [0, 8192, 12288, 14336, 16384]


def _results(spec_names: list[str]) -> list[dict[str, object]]:
    return [
        {"rank": r, "iteration_ms": {n: [1.0 + r, 2.0] for n in spec_names},
         **({"environment": {"torch": "2.11.0+cu130"}} if r == 0 else {})}
        for r in (1, 0)
    ]


def test_reference_arms_facts_and_timings() -> None:
    spec = load_spec(EXAMPLES / "te_reference_3arms.yaml")
    parts = build_manifest_parts(spec, _results(spec.variant_names()))
    manifest = parse_manifest({**parts.fields, **parts.extra})  # what the reader will see
    arms = {v.name: v for v in manifest.variants}
    assert manifest.workload.implementation == "te" and manifest.workload.cp_size == 2
    assert all(v.facts.cu_seqlens == v.facts.cu_seqlens_padded == CU for v in arms.values())
    assert (arms["auto_clone"].facts.padded_is_same_object,
            arms["auto_clone"].facts.pad_between_seqs) == (False, None)
    assert arms["explicit_false"].facts.pad_between_seqs is False
    assert arms["auto_same"].facts.padded_is_same_object is True
    assert arms["auto_same"].workload == {"metadata": "same_object"}
    assert arms["auto_clone"].iteration_ms == {0: [1.0, 2.0], 1: [2.0, 2.0]}
    assert manifest.environment == {"torch": "2.11.0+cu130"}
    assert parts.extra["variant_facts"]["auto_clone"]["padded_equals_unpadded"] is True


def test_adapter_facts_are_what_the_adapter_passes() -> None:
    spec = load_spec(EXAMPLES / "te_adapter_vs_stock.yaml")
    parts = build_manifest_parts(spec, [])
    arms = {v["name"]: v for v in parts.fields["variants"]}
    # Stock TE got a value-equal clone and None; the adapter passes one object and False.
    assert (arms["te_stock"]["facts"]["padded_is_same_object"],
            arms["te_stock"]["facts"]["pad_between_seqs"]) == (False, None)
    assert (arms["te_adapter"]["facts"]["padded_is_same_object"],
            arms["te_adapter"]["facts"]["pad_between_seqs"]) == (True, False)
    assert arms["te_adapter"]["workload"]["implementation"] == "te-adapter"
    assert arms["te_adapter"]["iteration_ms"] == {}


def test_real_padding_and_alignment_facts() -> None:
    spec = parse_spec({"name": "pad", "seqlens": [8190, 4094, 2048, 1968],
                       "metadata": "real_padding", "token_alignment": 128})
    parts = build_manifest_parts(spec, [])
    (variant,) = parts.fields["variants"]
    assert variant["name"] == "base" and variant["window"] == "arm:base"
    assert variant["facts"]["cu_seqlens"][-1] == 16300
    assert variant["facts"]["cu_seqlens_padded"][-1] == variant["facts"]["total_tokens"] == 16384
    assert variant["facts"]["zero_fill_grad_tails"] is True  # real padding: bundled clears it
    summary = parts.extra["variant_facts"]["base"]
    assert summary["padded_equals_unpadded"] is False and summary["total_tokens_aligned"] is True
