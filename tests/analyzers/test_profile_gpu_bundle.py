"""The real one-H200 bundle of ``cptrace profile --nsys --probe`` (TE 2.20.2, no CP).

``tests/data/te-2.20.2-h200-profile`` came back from ``benchmarks/gpu_profile_te.sh`` (see
``benchmarks/results/profile_gpu_h200.md``): the probe's facts in the manifest, one nsys export.
The analysis must cite what the probe observed; with no CP, FP8 or FSDP no rule fires, so the
report's notes say what was observed and why nothing judged it. Under FP8, the same real facts
make the token-alignment finding cite the probe instead.
"""

from __future__ import annotations

import pytest
from testkit import DATA_DIR

from analyzers.bundle import read_bundle
from analyzers.findings import evaluate
from analyzers.pipeline import run_analysis

BUNDLE = DATA_DIR / "te-2.20.2-h200-profile"
OBSERVED_SENTENCE = (
    "value-equal clone in 16 of 16 sampled calls; TE resolved pad_between_seqs=True (16 calls)"
)


@pytest.fixture(scope="module")
def analysis():  # type: ignore[no-untyped-def]
    return run_analysis(BUNDLE)


def test_the_manifest_holds_the_probe_facts_from_te_2_20() -> None:
    with read_bundle(BUNDLE) as bundle:
        manifest = bundle.manifest
    assert manifest.environment["transformer_engine"] == "2.20.2"
    assert manifest.environment["gpu_models"] == ["NVIDIA H200"]
    (variant,) = manifest.variants
    observed = variant.facts.observed
    assert observed is not None
    assert observed.function == "transformer_engine.DotProductAttention.forward"
    assert observed.transformer_engine == "2.20.2"
    # 8 steps x 4 TransformerLayers; TE 2.20 passes the packed qkv_layer (query_layer None).
    assert (observed.calls, observed.sampled_calls) == (32, 16)
    assert (observed.same_object_calls, observed.value_equal_calls) == (0, 16)
    assert observed.pad_between_seqs_resolved == {"true": 16}
    assert observed.local_tokens_aligned == {"8": 16, "16": 16, "128": 0}
    assert observed.not_observed == []
    assert variant.facts.total_tokens == 9008
    assert variant.facts.padded_is_same_object is False


def test_analysis_of_the_real_bundle_notes_what_the_probe_observed(analysis) -> None:  # type: ignore[no-untyped-def]
    report = analysis.report
    assert report.ranks == [0]
    assert {h.helper for h in report.helpers} >= {"te_fused_attn_fwd", "te_fused_attn_bwd"}
    # One GPU, no CP: no padding finding (the CP fast-path/padded-path rules must stay quiet).
    assert report.findings == []
    (note,) = [n for n in report.notes if n.startswith("cptrace.probe observed in the job")]
    assert "transformer_engine.DotProductAttention.forward on ranks [0]" in note
    assert "16 of 32 calls sampled, TE 2.20.2" in note
    assert OBSERVED_SENTENCE in note
    assert "multiple of 128 in 0 of 16 sampled calls" in note
    assert "No finding rests on these facts: CP size 1" in note


def test_under_fp8_the_same_real_facts_are_cited_by_token_alignment(analysis) -> None:  # type: ignore[no-untyped-def]
    with read_bundle(BUNDLE) as bundle:
        manifest = bundle.manifest
    variant = manifest.variants[0]
    fp8 = manifest.model_copy(update={"variants": [
        variant.model_copy(update={"facts": variant.facts.model_copy(update={"fp8": True})})
    ]})
    findings = evaluate(analysis.metrics, fp8)
    (finding,) = [f for f in findings if f.rule == "token-alignment"]
    assert finding.title.startswith("9008 packed tokens (9008 per rank) are not a multiple of 128")
    cited = {e.name: e.value for e in finding.evidence}
    name = (
        "observed in the job by cptrace.probe "
        "(transformer_engine.DotProductAttention.forward on ranks [0])"
    )
    assert "multiple of 8 in 16 of 16" in str(cited[name])
    assert finding.recommendation.startswith("Observed in the job: per-rank token count")
