"""Workload specs: examples load, invalid specs name the field and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.packing import build_layout
from runners.spec import SpecError, layout_for, load_spec, parse_spec

EXAMPLES = sorted((Path(__file__).parents[2] / "runners" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_is_valid(path: Path) -> None:
    spec = load_spec(path)
    for name in spec.variant_names():
        workload = spec.variant_workload(name)
        assert layout_for(workload, spec.ranks).total_tokens > 0


def test_examples_cover_the_scenarios() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"cpu_smoke", "te_reference_3arms", "bundled_fixed_vs_broken",
            "allgather_dcs_vs_nlb"} <= names


def test_reference_spec_variants() -> None:
    spec = load_spec(EXAMPLES[0].parent / "te_reference_3arms.yaml")
    assert spec.variant_names() == ["auto_clone", "explicit_false", "auto_same"]
    assert spec.variant_workload("explicit_false").pad_between_seqs is False
    assert spec.variant_workload("auto_same").metadata == "same_object"
    assert spec.variant_workload("auto_clone").pad_between_seqs is None
    assert spec.profilers.uses_nsys and spec.profilers.uses_torch


BASE = {"name": "t"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**BASE, "pad_between_seq": False}, "field pad_between_seq: Extra inputs"),
        ({**BASE, "implementation": "flash"}, "field implementation: Input should be 'bundled'"),
        ({**BASE, "cp_comm": "a2a"}, "field cp_comm: Input should be 'p2p' or 'all_gather'"),
        ({**BASE, "heads": 0}, "field heads: Input should be greater than or equal to 1"),
        ({**BASE, "kv_heads": 5}, "field kv_heads: 5 must divide heads"),
        ({**BASE, "seqlens": [10, 20]}, "field seqlens: DualChunkSwap needs every length "
                                        "divisible by 2\\*ranks=4; \\[10\\]"),
        ({**BASE, "seqlens": [8, -4]}, "field seqlens.1: Input should be greater than"),
        ({**BASE, "seqlens": {"count": 2, "min": 9, "max": 3}}, "max \\(3\\) must be >= min"),
        ({**BASE, "strategy": "no_load_balance", "seqlens": [3, 4]},
         "NoLoadBalance needs the packed total \\(7\\) divisible by ranks=2"),
        ({**BASE, "token_alignment": 128, "seqlens": [8, 8]},
         "field seqlens: token_alignment 128 pads the total 16 to 128"),
        ({**BASE, "implementation": "te", "broken_identity_padding": True},
         "apply to implementation 'bundled' only"),
        ({**BASE, "implementation": "te_adapter", "pad_between_seqs": False},
         "te_adapter decides it from values"),
        ({**BASE, "profilers": {"mode": "perf"}}, "field profilers.mode: Input should be"),
        ({**BASE, "variants": {"a": {"ranks": 4}}},
         "field variants.a: overrides run-level field\\(s\\) \\['ranks'\\]"),
        ({**BASE, "variants": {"a": {"metadata": "identity"}}},
         "field variants.a.metadata: Input should be 'same_object'"),
        ({**BASE, "variants": {"a": {"seqlens": [6]}}}, "field variants.a.seqlens: DualChunkSwap"),
        ({**BASE, "variants": {"a b": {}}}, "field variants: name 'a b'"),
        ({"ranks": 2}, "field name: Field required"),
        ({**BASE, "name": "../etc"}, "field name: String should match pattern"),
        (["not", "a", "mapping"], "expected a mapping of fields, got list"),
    ],
)
def test_invalid_specs_name_field_and_reason(raw: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(raw, source="s.yaml")


def test_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nlayers: many\n")
    with pytest.raises(SpecError, match=r"bad.yaml: field layers: Input should be a valid integer"):
        load_spec(path)
    path.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml: not valid YAML"):
        load_spec(path)


def test_seeded_distribution_is_reproducible() -> None:
    raw = {**BASE, "seqlens": {"count": 16, "min": 100, "max": 9000, "multiple_of": 4,
                              "distribution": "loguniform", "seed": 7}}
    first = parse_spec(raw).resolved_seqlens()
    assert first == parse_spec(raw).resolved_seqlens()
    assert len(first) == 16 and all(s % 4 == 0 and 100 <= s <= 9000 for s in first)
    other = parse_spec({**raw, "seqlens": {**raw["seqlens"], "seed": 8}}).resolved_seqlens()
    assert other != first


def test_variant_overrides_and_base_variant() -> None:
    spec = parse_spec({**BASE, "layers": 2, "variants": {"deep": {"layers": 8}}})
    assert spec.variant_workload("deep").layers == 8
    assert parse_spec(BASE).variant_names() == ["base"]


def test_layout_real_padding_and_alignment() -> None:
    layout = build_layout([8190, 4094, 2048, 1968], ranks=2, strategy="dual_chunk_swap",
                          metadata="real_padding", token_alignment=128)
    assert layout.cu_seqlens == (0, 8190, 12284, 14332, 16300)
    assert layout.cu_seqlens_padded == (0, 8192, 12288, 14336, 16384)
    assert not layout.padded_equals_unpadded
    same = build_layout([8192, 4096], ranks=2, strategy="dual_chunk_swap",
                        metadata="same_object", token_alignment=None)
    assert same.padded_equals_unpadded and same.total_tokens == 12288
