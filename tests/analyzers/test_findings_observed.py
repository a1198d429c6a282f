"""Findings built on probe-observed facts cite them; one-GPU runs are not flagged as CP mistakes."""

from __future__ import annotations

from typing import Any

import pytest

from analyzers.findings import evaluate
from analyzers.manifest import parse_manifest
from analyzers.metrics import Metrics
from analyzers.report import Category, HelperStat, Severity

EQUAL = [0, 8192, 12288, 14336, 16384]


def _attention(group: str, ranks: tuple[int, ...] = (0, 1)) -> Metrics:
    rows = [
        HelperStat(rank=r, window=group, steps=3, helper="te_fused_attn_fwd",
                   category=Category.ATTENTION, launches=168, activities=168, kernels=168,
                   gpu_time_ns=100_000, matched_by="python", calls=168, host_time_ns=400_000)
        for r in ranks
    ]
    m = Metrics(windows=[], groups=[group, "whole trace"], steps={(r, group): 3 for r in ranks})
    m.helpers = rows
    return m


def _manifest(facts: dict[str, Any], workload: dict[str, Any], **extra: Any) -> Any:
    return parse_manifest({
        "workload": workload,
        "variants": [{"name": "x", "window": "arm:x", "facts": facts}],
        **extra,
    })


OBSERVED = {
    "function": "transformer_engine.DotProductAttention.forward",
    "ranks": [0, 1],
    "calls": 400,
    "sampled_calls": 64,
    "same_object_calls": 0,
    "value_equal_calls": 64,
    "pad_between_seqs_passed": {"null": 64},
    "pad_between_seqs_resolved": {"true": 64},
    "local_tokens_aligned": {"8": 0, "16": 0, "128": 0},
    "fp8_recipes": ["DelayedScaling"],
    "not_observed": [],
}


def test_token_alignment_cites_the_probe_and_the_failure() -> None:
    facts = {"cu_seqlens": [0, 4002, 6048, 8146], "total_tokens": 8146, "fp8": True,
             "observed": OBSERVED}
    failure = {"summary": "rank 1 raised ValueError at utils.py:709", "failed_rank": 1}
    workload = {"implementation": "te", "cp_size": 1}
    findings = evaluate(_attention("arm:x", (0,)), _manifest(facts, workload, failure=failure))
    finding = next(f for f in findings if f.rule == "token-alignment")
    # TE version unknown: the pad is a multiple of 16, safe on every catalogued TE version
    assert "Pad the packed batch to 8160 tokens (14 padding tokens" in finding.recommendation
    assert finding.recommendation.startswith("Observed in the job: per-rank token count")
    cited = {e.name: e.value for e in finding.evidence}
    assert "FP8 recipe DelayedScaling" in str(
        cited["observed in the job by cptrace.probe "
              "(transformer_engine.DotProductAttention.forward on ranks [0, 1])"]
    )
    assert cited["the run failed"] == failure["summary"]


@pytest.mark.parametrize(
    ("tokens", "te", "title", "pad"),
    [
        # TE 2.20.2's FP8 GEMMs assert lda % 16 == 0 in cuBLASLt: 8152 would still crash
        (8146, "2.20.2", "not a multiple of 16", 8160),
        (1000, "2.20.2", "not a multiple of 16", 1008),  # passes TE's own check, then crashes
        (8146, "2.19.0", "not a multiple of 8", 8152),  # not listed: the catalog's default, 8
        (8146, None, "not a multiple of 8", 8160),  # unknown: the strictest catalogued pad
    ],
)
def test_fp8_alignment_comes_from_the_catalog_per_te_version(
    tokens: int, te: str | None, title: str, pad: int
) -> None:
    observed = {**OBSERVED, "transformer_engine": te}
    facts = {"total_tokens": tokens, "fp8": True, "observed": observed}
    findings = evaluate(_attention("arm:x", (0,)), _manifest(facts, {"cp_size": 1}))
    finding = next(f for f in findings if f.rule == "token-alignment")
    assert finding.severity is Severity.ERROR and title in finding.title
    assert f"Pad the packed batch to {pad} tokens ({pad - tokens} padding" in (
        finding.recommendation
    )
    if te == "2.20.2":
        assert "TE 2.20.2's FP8 GEMMs need the token dimension divisible by 16" in (
            finding.recommendation
        )


def test_fp8_alignment_reads_the_te_version_of_the_environment() -> None:
    facts = {"total_tokens": 8152, "fp8": True}  # a multiple of 8, not 16
    manifest = _manifest(facts, {"cp_size": 1}, environment={"transformer_engine": "2.20.2"})
    finding = next(
        f for f in evaluate(_attention("arm:x", (0,)), manifest) if f.rule == "token-alignment"
    )
    assert finding.severity is Severity.ERROR and "Pad the packed batch to 8160" in (
        finding.recommendation
    )


def test_declared_facts_read_as_before() -> None:
    facts = {"total_tokens": 8146, "fp8": True}
    findings = evaluate(_attention("arm:x", (0,)), _manifest(facts, {"cp_size": 1}))
    finding = next(f for f in findings if f.rule == "token-alignment")
    assert not finding.recommendation.startswith("Observed")
    assert not [e for e in finding.evidence if e.name.startswith("observed")]


def test_one_gpu_without_cp_metadata_launches_is_not_the_cp_fast_path() -> None:
    # te_fp8_aligned.yaml on one H200: padded offsets, attention, no per-step CP metadata
    # (there is no CP). Before, this was an ERROR fast-path-with-padding.
    padded = [0, 4002, 6048, 8160]
    facts = {"cu_seqlens": [0, 4002, 6048, 8146], "cu_seqlens_padded": padded}
    one_gpu = evaluate(_attention("arm:x", (0,)), _manifest(facts, {"implementation": "te",
                                                                    "cp_size": 1}))
    assert "fast-path-with-padding" not in {f.rule for f in one_gpu}
    two_gpu = evaluate(_attention("arm:x"), _manifest(
        {"cu_seqlens": EQUAL, "cu_seqlens_padded": [0, 8192, 12288, 14336, 16400]},
        {"implementation": "te", "cp_size": 2, "cp_comm": "p2p"},
    ))
    assert "fast-path-with-padding" in {f.rule for f in two_gpu}


def test_padding_findings_cite_the_observed_identity_and_resolution() -> None:
    from analyzers.findings.observed import metadata_sentence
    from analyzers.manifest import ObservedFacts

    text = metadata_sentence(ObservedFacts.model_validate(OBSERVED))
    assert text == (
        "value-equal clone in 64 of 64 sampled calls; TE resolved pad_between_seqs=True (64 calls)"
    )
